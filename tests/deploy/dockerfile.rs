//! Reads what the Dockerfile's final stage runs: ENTRYPOINT, CMD,
//! HEALTHCHECK, ENV, EXPOSE and USER.
//!
//! Only what the deployment files rely on is understood: line
//! continuations, comments, exec-form (JSON) commands. A shell-form
//! ENTRYPOINT, CMD or HEALTHCHECK is an error, since its argv depends on a
//! shell (hadolint warns about it too).

use std::collections::BTreeMap;

/// The final stage of a Dockerfile.
#[derive(Debug, Clone, Default)]
pub struct Image {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// `HEALTHCHECK ... CMD [argv]`.
    pub healthcheck: Option<Vec<String>>,
    pub expose: Vec<u16>,
    pub user: Option<String>,
}

impl Image {
    /// What `docker run IMAGE` runs: ENTRYPOINT then CMD.
    pub fn argv(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

/// Joins continued lines and drops comments (a comment inside a continued
/// instruction is dropped too, as Docker does).
fn instructions(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut first_line = 0;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if current.is_empty() {
            first_line = i + 1;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                out.push((first_line, std::mem::take(&mut current)));
            }
        }
    }
    if !current.trim().is_empty() {
        out.push((first_line, current));
    }
    out
}

fn exec_form(keyword: &str, line: usize, rest: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(rest.trim()).map_err(|_| {
        format!("Dockerfile:{line}: {keyword} must use the exec form [\"...\"], got {rest}")
    })
}

/// `K=V K2="a b"`, or the legacy `K V`.
fn env_pairs(rest: &str) -> BTreeMap<String, String> {
    let rest = rest.trim();
    let mut out = BTreeMap::new();
    let first = rest.split_whitespace().next().unwrap_or("");
    if !first.contains('=') {
        let (k, v) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        out.insert(k.to_owned(), v.trim().to_owned());
        return out;
    }
    let mut token = String::new();
    let mut quoted = false;
    let mut tokens = Vec::new();
    for c in rest.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !token.is_empty() {
                    tokens.push(std::mem::take(&mut token));
                }
            }
            c => token.push(c),
        }
    }
    if !token.is_empty() {
        tokens.push(token);
    }
    for t in tokens {
        if let Some((k, v)) = t.split_once('=') {
            out.insert(k.to_owned(), v.to_owned());
        }
    }
    out
}

/// The final stage of `text`.
pub fn parse(text: &str) -> Result<Image, String> {
    let mut image = None::<Image>;
    for (line, instruction) in instructions(text) {
        let (keyword, rest) = instruction
            .split_once(char::is_whitespace)
            .unwrap_or((instruction.as_str(), ""));
        let keyword = keyword.to_ascii_uppercase();
        if keyword == "FROM" {
            image = Some(Image::default());
            continue;
        }
        let Some(stage) = image.as_mut() else {
            // ARG before the first FROM.
            continue;
        };
        match keyword.as_str() {
            "ENTRYPOINT" => stage.entrypoint = exec_form("ENTRYPOINT", line, rest)?,
            "CMD" => stage.cmd = exec_form("CMD", line, rest)?,
            "ENV" => stage.env.extend(env_pairs(rest)),
            "USER" => stage.user = Some(rest.trim().to_owned()),
            "EXPOSE" => {
                for port in rest.split_whitespace() {
                    let number = port.split('/').next().unwrap_or(port);
                    stage.expose.push(
                        number.parse().map_err(|_| {
                            format!("Dockerfile:{line}: EXPOSE {port} is not a port")
                        })?,
                    );
                }
            }
            "HEALTHCHECK" => {
                let rest = rest.trim();
                if rest.eq_ignore_ascii_case("NONE") {
                    stage.healthcheck = None;
                    continue;
                }
                let at = rest
                    .find(" CMD ")
                    .map(|i| i + 1)
                    .or_else(|| rest.starts_with("CMD ").then_some(0));
                let at = at.ok_or_else(|| format!("Dockerfile:{line}: HEALTHCHECK without CMD"))?;
                stage.healthcheck = Some(exec_form("HEALTHCHECK CMD", line, &rest[at + 4..])?);
            }
            _ => {}
        }
    }
    image.ok_or_else(|| "Dockerfile: no FROM".to_owned())
}
