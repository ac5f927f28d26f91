//! The status page (`GET /` on the admin port) in a real browser: headless
//! Chromium (Debian's `chromium`, installed by scripts/deps.sh) loads it
//! from a running server, its DOM must hold the tables with the rule, its
//! counts and the throttled key (escaped, never markup), and a screenshot
//! must be a PNG with content on it. A missing Chromium fails the test.

mod common;

use common::*;
use std::path::Path;
use std::process::Output;
use tokio::process::Command;
use tollgate::admin_client::{request, AdminTarget};

/// A key that would become an element if the page inserted it as HTML.
const HOSTILE_KEY: &str = "<img id=pwn src=x>";

/// Runs headless Chromium on `url` with `args` (a profile of its own
/// under `dir`); fails the test when it cannot run.
async fn chromium(dir: &Path, url: &str, args: &[&str]) -> Output {
    let mut command = Command::new("chromium");
    command
        .args([
            "--headless",
            // Tests run as root in CI, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(args)
        .arg(url)
        .kill_on_drop(true);
    let output = tokio::time::timeout(PATIENCE * 6, command.output())
        .await
        .expect("chromium finishes within a minute")
        .unwrap_or_else(|e| {
            panic!("cannot run `chromium` ({e}): run scripts/deps.sh (Debian package chromium)")
        });
    assert!(
        output.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The `<table id="ID">...</table>` of `dom`.
fn table<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table #{id} in the page:\n{dom}"));
    let end = start + dom[start..].find("</table>").expect("the table ends");
    &dom[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_its_tables_in_chromium() {
    let server = TestServer::start_admin(|c| {
        c.store.max_memory = Some(64 << 20);
    })
    .await;
    let admin = server.admin.unwrap();
    let put = http(
        admin,
        "PUT",
        "/v1/rules/search-api",
        Some(r#"{"rate": "2/s", "burst": 2}"#),
    )
    .await;
    assert_eq!(put.status, 201, "{}", put.text());
    // Three checks on the hostile key: two allowed, one denied (and so
    // throttled); one on a plain key.
    let mut conn = RawConn::ready(server.addr).await;
    let results = conn
        .check(
            1,
            batch_of(vec![
                vec![rule(HOSTILE_KEY, "search-api", 1)],
                vec![rule(HOSTILE_KEY, "search-api", 1)],
                vec![rule(HOSTILE_KEY, "search-api", 1)],
                vec![tb("plain", 10, 1000, 10, 1)],
            ]),
        )
        .await;
    let granted: Vec<bool> = results.iter().map(allowed).collect();
    assert_eq!(granted, [true, true, false, true]);

    let dir = TempDir::new("status-page");
    let url = format!("http://{admin}/");
    let dom = chromium(&dir.0, &url, &["--dump-dom"]).await;
    let dom = String::from_utf8(dom.stdout).expect("the DOM is UTF-8");

    let node = table(&dom, "node");
    assert!(node.contains("<td>primary</td>"), "{node}");
    assert!(node.contains("<th>epoch</th>"), "{node}");
    let rules = table(&dom, "rules");
    let row = rules
        .split("<tr>")
        .find(|r| r.contains("<code>search-api</code>"))
        .unwrap_or_else(|| panic!("no row for the rule: {rules}"));
    // allowed 2, denied 1, shadow-denied 0, in that order.
    assert!(
        row.contains(r#"<td class="num">2</td><td class="num">1</td><td class="num">0</td>"#),
        "{row}"
    );
    let inline = rules
        .split("<tr>")
        .find(|r| r.contains("<code>inline</code>"))
        .unwrap_or_else(|| panic!("no row for inline limits: {rules}"));
    assert!(inline.contains(r#"<td class="num">1</td><td class="num">0</td>"#));
    let throttled = table(&dom, "throttled");
    assert!(
        throttled.contains("<code>&lt;img id=pwn src=x&gt;</code>"),
        "the key shows as text: {throttled}"
    );
    assert!(!dom.contains(r#"id="pwn""#), "the key became markup: {dom}");
    let memory = table(&dom, "memory");
    assert!(memory.contains("64.0 MiB"), "{memory}");
    assert!(memory.contains("<meter"), "{memory}");
    // No cluster section outside cluster mode.
    assert!(!dom.contains(r#"<table id="cluster""#));
    assert!(dom.contains(r#"http-equiv="refresh" content="5""#));

    // The screenshot: a PNG of the window's size with a page on it.
    let shot = dir.path("status.png");
    chromium(
        &dir.0,
        &url,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1024,900",
        ],
    )
    .await;
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert_not_blank(&png, 1024, 900);
    server.stop().await;
}

/// `png` decodes to `width` x `height` pixels, and they are not one
/// colour: the background, table borders and text differ, so a blank or
/// failed render (one flat colour) is caught.
fn assert_not_blank(png: &[u8], width: u32, height: u32) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let mut reader = decoder.read_info().expect("a valid PNG");
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).expect("a PNG frame");
    assert_eq!((frame.width, frame.height), (width, height));
    let channels = frame.color_type.samples();
    let pixels = &pixels[..frame.buffer_size()];
    let background = &pixels[..channels];
    let differing = pixels
        .chunks_exact(channels)
        .filter(|p| *p != background)
        .count();
    let colours: std::collections::HashSet<&[u8]> = pixels.chunks_exact(channels).collect();
    let total = (width * height) as usize;
    // Text and tables cover well over 1% of a page with five tables, and
    // anti-aliased text alone brings dozens of colours.
    assert!(
        differing * 100 > total,
        "only {differing} of {total} pixels differ from the background"
    );
    assert!(colours.len() > 16, "only {} colours", colours.len());
}

#[tokio::test]
async fn the_status_page_wants_the_admin_token() {
    const TOKEN: &str = "status-page-token";
    let server = TestServer::start_admin(|c| c.auth.admin_token = Some(TOKEN.into())).await;
    let target = |token: Option<&str>| {
        AdminTarget::plain(&server.admin.unwrap().to_string()).with_token(token.map(Into::into))
    };
    let get = |token| {
        let target = target(token);
        async move {
            request(&target, hyper::Method::GET, "/", None, PATIENCE)
                .await
                .unwrap()
        }
    };
    assert_eq!(get(None).await.status, 401);
    assert_eq!(get(Some("wrong")).await.status, 401);
    let page = get(Some(TOKEN)).await;
    assert_eq!(page.status, 200);
    assert!(page.text().starts_with("<!DOCTYPE html>"));
    server.stop().await;
}
