//! The deployment files against the real binary, so they cannot drift from
//! the CLI: every `tollgate serve` command line in the Dockerfile, the
//! compose files (deploy/compose/) and the Kubernetes manifests
//! (deploy/kubernetes/) runs with `--print-config` appended and the
//! environment the file sets, and must be accepted. Then what the files
//! promise is checked against the settings the binary reports: a pair is a
//! primary and its standby naming each other, probes and ports are the
//! ones the server opens, the rules file the server reads is mounted and
//! valid, the memory request covers --max-memory.
//!
//! No container engine or cluster runs here, so nothing is pulled, built
//! or applied; scripts/lint-deploy.sh (in .ci/run) lints the Dockerfile
//! with hadolint and validates the manifests against the API schemas.

#[path = "../common/mod.rs"]
mod common;
mod compose;
mod dockerfile;
mod kube;
mod launch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_norway::Value;

use dockerfile::Image;
use launch::{flag_value, Launch};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const DOCKERFILE: &str = "Dockerfile";
const PAIR_COMPOSE: &str = "deploy/compose/pair.yml";
const CLUSTER_COMPOSE: &str = "deploy/compose/cluster.yml";
const STATEFULSET: &str = "deploy/kubernetes/statefulset.yaml";

/// The operator's environment when running compose: the secrets the
/// files require.
fn operator_vars() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "TOLLGATE_AUTH_TOKEN".to_owned(),
            "client-token-stand-in".to_owned(),
        ),
        (
            "TOLLGATE_ADMIN_TOKEN".to_owned(),
            "admin-stand-in".to_owned(),
        ),
        (
            "TOLLGATE_CLUSTER_SECRET".to_owned(),
            "cluster-stand-in".to_owned(),
        ),
    ])
}

/// Prometheus's rule files: not deployments (tests/dashboards checks them).
const PROMETHEUS_RULES: &str = "deploy/prometheus";

/// Every YAML file below deploy/ (but the Prometheus rules), relative to
/// the root, sorted.
fn deploy_yaml_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read deploy/") {
            let path = entry.expect("a directory entry").path();
            if path.ends_with(PROMETHEUS_RULES) {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yml" | "yaml")
            ) {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&Path::new(ROOT).join("deploy"), &mut paths);
    let mut files: Vec<String> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(ROOT).expect("below the root");
            rel.to_string_lossy().into_owned()
        })
        .collect();
    files.sort();
    files
}

/// The image's own command, with the secrets `docker run -e` supplies
/// (deploy/README.md).
fn image_launch(image: &Image, origin: String, vars: &BTreeMap<String, String>) -> Launch {
    Launch {
        origin,
        argv: image.argv(),
        env: image.env.clone().into_iter().chain(vars.clone()).collect(),
    }
}

/// What the deployment files describe.
struct Deployment {
    image: Image,
    /// Every container that runs the Tollgate image, in every file.
    launches: Vec<Launch>,
    compose: BTreeMap<String, Vec<compose::Service>>,
    objects: Vec<kube::Object>,
}

/// Reads every deployment file, with `edits` (path -> text) standing in for
/// files on disk. Every YAML file below deploy/ must be a compose file or a
/// Kubernetes manifest: none is skipped.
fn read_all(
    edits: &BTreeMap<&str, String>,
    vars: &BTreeMap<String, String>,
) -> Result<Deployment, String> {
    let read = |rel: &str| match edits.get(rel) {
        Some(text) => Ok(text.clone()),
        None => {
            std::fs::read_to_string(Path::new(ROOT).join(rel)).map_err(|e| format!("{rel}: {e}"))
        }
    };
    let image = dockerfile::parse(&read(DOCKERFILE)?)?;
    let mut launches = vec![image_launch(
        &image,
        format!("{DOCKERFILE}: ENTRYPOINT + CMD"),
        vars,
    )];
    let mut compose = BTreeMap::new();
    let mut objects = Vec::new();
    for file in deploy_yaml_files() {
        let text = read(&file)?;
        let doc: Value = match serde_norway::from_str(&text) {
            Ok(doc) => doc,
            // Several documents: a manifest.
            Err(_) => Value::Null,
        };
        if doc.get("services").is_some() {
            let dir = Path::new(ROOT).join(&file);
            let dir = dir.parent().expect("a file has a folder");
            let services = compose::services(&file, &text, dir, &image, vars)?;
            launches.extend(services.iter().map(|s| s.launch.clone()));
            compose.insert(file, services);
        } else {
            objects.extend(kube::objects(&file, &text)?);
        }
    }
    for pod in kube::pods(&objects) {
        for container in kube::tollgate_containers(&pod) {
            launches.push(kube::launch(&pod, container, &image, &objects)?);
        }
    }
    Ok(Deployment {
        image,
        launches,
        compose,
        objects,
    })
}

/// Runs every launch with --print-config: their settings, or every failure.
fn print_configs(launches: &[Launch]) -> Result<Vec<(Launch, serde_json::Value)>, String> {
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    for launch in launches {
        match launch.print_config() {
            Ok(config) => ok.push((launch.clone(), config)),
            Err(e) => failures.push(e),
        }
    }
    if failures.is_empty() {
        Ok(ok)
    } else {
        Err(failures.join("\n"))
    }
}

fn port_of(addr: &serde_json::Value) -> u16 {
    let addr = addr
        .as_str()
        .unwrap_or_else(|| panic!("an address: {addr}"));
    let port = addr.rsplit(':').next().unwrap_or("");
    port.parse().unwrap_or_else(|_| panic!("no port in {addr}"))
}

/// A pair as docs/REPLICATION.md runs it: one primary, one
/// standby of it, each the other's --peer, both with auth and an
/// --advertise that others can reach.
fn assert_pair(nodes: &[(Launch, serde_json::Value)]) {
    assert_eq!(nodes.len(), 2, "a pair is two nodes: {nodes:?}");
    let (primaries, standbys): (Vec<_>, Vec<_>) =
        nodes.iter().partition(|(_, c)| c["replica-of"].is_null());
    assert_eq!(primaries.len(), 1, "one primary: {nodes:?}");
    assert_eq!(standbys.len(), 1, "one standby: {nodes:?}");
    let (p, s) = (&primaries[0].1, &standbys[0].1);
    assert_eq!(s["replica-of"], p["advertise"], "{}", standbys[0].0.origin);
    assert_eq!(p["peer"], s["advertise"], "{}", primaries[0].0.origin);
    assert_eq!(s["peer"], p["advertise"], "{}", standbys[0].0.origin);
    for (launch, c) in nodes {
        assert_eq!(c["auth-token"], "<redacted>", "{}: no auth", launch.origin);
        assert!(!c["failover-after"].is_null(), "{}", launch.origin);
        assert_eq!(
            port_of(&c["advertise"]),
            port_of(&c["listen"]),
            "{}",
            launch.origin
        );
    }
}

/// The rules file a node reads must parse as the server would parse it.
fn assert_rules_valid(origin: &str, text: &str, config: &serde_json::Value) {
    let max_log_entries = config["max-log-entries"].as_u64().unwrap();
    let rules = tollgate::rules::spec::parse_yaml(text, max_log_entries)
        .unwrap_or_else(|e| panic!("{origin}: the rules file is refused: {e}"));
    assert!(!rules.is_empty(), "{origin}: no rules");
}

#[test]
fn every_tollgate_command_line_is_accepted_by_the_binary() {
    let deployment = read_all(&BTreeMap::new(), &operator_vars()).unwrap();
    let configs = print_configs(&deployment.launches).unwrap_or_else(|e| panic!("{e}"));
    // Each kind of file yields command lines: the check cannot pass on
    // nothing.
    let from = |prefix: &str| {
        configs
            .iter()
            .filter(|(l, _)| l.origin.starts_with(prefix))
            .count()
    };
    assert_eq!(from(DOCKERFILE), 1);
    assert!(from("deploy/compose/") >= 3, "{configs:?}");
    assert!(from("deploy/kubernetes/") >= 2, "{configs:?}");
    for (file, services) in &deployment.compose {
        assert!(!services.is_empty(), "{file}: no Tollgate service");
    }
    for (launch, config) in &configs {
        assert!(
            config["listen"].as_str().unwrap().starts_with("0.0.0.0:"),
            "{}: a container listens on every interface",
            launch.origin
        );
    }
    eprintln!("{} command lines accepted", configs.len());
}

#[test]
fn a_bad_flag_or_a_missing_secret_fails_the_check() {
    for (file, from, to, named) in [
        (
            DOCKERFILE,
            "\"--log-format\"",
            "\"--log-fromat\"",
            "--log-fromat",
        ),
        (
            PAIR_COMPOSE,
            "- --failover-after",
            "- --failover-afer",
            "--failover-afer",
        ),
        (
            STATEFULSET,
            "--max-memory 512MiB",
            "--max-memroy 512MiB",
            "--max-memroy",
        ),
        (CLUSTER_COMPOSE, "- --shard", "- --shart", "--shart"),
        (
            STATEFULSET,
            "--failover-after 2s",
            "--failover-after 2",
            "time unit needed",
        ),
    ] {
        let text = std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap();
        assert!(text.contains(from), "{file} no longer holds {from}");
        let edits = BTreeMap::from([(file, text.replacen(from, to, 1))]);
        let deployment = read_all(&edits, &operator_vars()).unwrap();
        let Err(err) = print_configs(&deployment.launches) else {
            panic!("{file} with {to} passed the check");
        };
        assert!(err.contains(file) && err.contains(named), "{err}");
    }
    // Compose refuses to start without each secret.
    for missing in operator_vars().keys() {
        let mut vars = operator_vars();
        vars.remove(missing);
        let err = read_all(&BTreeMap::new(), &vars)
            .err()
            .unwrap_or_else(|| panic!("started without {missing}"));
        assert!(err.contains(&format!("{missing} must be set")), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_unprivileged_and_its_health_check_asks_the_admin_api() {
    let image = read_all(&BTreeMap::new(), &operator_vars()).unwrap().image;
    let uid: u32 = image
        .user
        .as_deref()
        .and_then(|u| u.split(':').next()?.parse().ok())
        .expect("USER with a numeric uid");
    assert_ne!(uid, 0, "the image must not run as root");
    let launch = image_launch(&image, DOCKERFILE.into(), &operator_vars());
    let config = launch.print_config().unwrap();
    let (listen, admin) = (port_of(&config["listen"]), port_of(&config["admin"]));
    assert!(image.expose.contains(&listen), "EXPOSE {listen}");
    assert!(image.expose.contains(&admin), "EXPOSE {admin}");

    let mut check = image.healthcheck.clone().expect("a HEALTHCHECK");
    assert_eq!(check[..2], ["tollgate", "health"], "{check:?}");
    let at = flag_value(&check, "--admin").expect("--admin").to_owned();
    assert_eq!(at, format!("127.0.0.1:{admin}"), "the port CMD opens");

    // The health check, as written, against a real admin API.
    let server = common::TestServer::start_admin(|_| {}).await;
    let real = server.admin.unwrap().to_string();
    for arg in check.iter_mut().filter(|a| **a == at) {
        arg.clone_from(&real);
    }
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&check[1..])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["status"], "ok");
    server.stop().await;
}

#[test]
fn the_compose_pair_is_a_primary_and_its_standby_with_rules_mounted() {
    let deployment = read_all(&BTreeMap::new(), &operator_vars()).unwrap();
    let services = &deployment.compose[PAIR_COMPOSE];
    let launches: Vec<Launch> = services.iter().map(|s| s.launch.clone()).collect();
    let nodes = print_configs(&launches).unwrap();
    assert_pair(&nodes);
    for (service, (_, config)) in services.iter().zip(&nodes) {
        let origin = &service.launch.origin;
        for port in [port_of(&config["listen"]), port_of(&config["admin"])] {
            assert!(
                service.container_ports.contains(&port),
                "{origin}: {port} unpublished"
            );
        }
        // The advertised host is the service's name on the compose network.
        let advertise = config["advertise"].as_str().unwrap();
        assert!(
            advertise.starts_with(&format!("{}:", service.name)),
            "{origin}"
        );
        let rules = config["rules"].as_str().expect("a rules file");
        let (source, _) = service
            .mounts
            .iter()
            .find(|(_, target)| target == rules)
            .unwrap_or_else(|| panic!("{origin}: {rules} is not mounted"));
        let text = std::fs::read_to_string(source)
            .unwrap_or_else(|e| panic!("{origin}: {}: {e}", source.display()));
        assert_rules_valid(origin, &text, config);
    }
}

/// Bytes of a Kubernetes quantity (`1Gi`, `512Mi`, `1G`, `1000`).
fn quantity_bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().expect("a whole quantity") * factor;
        }
    }
    q.parse().expect("a quantity")
}

/// Resident memory a node can reach with these settings, by the figures of
/// docs/BENCHMARKS.md that the StatefulSet's comment derives its request
/// from.
fn memory_budget(c: &serde_json::Value) -> u64 {
    /// Resident bytes over table bytes, worst algorithm (sliding log at 1M
    /// keys: 189.7 / 144.3).
    const RESIDENT_PER_TABLE_BYTE: f64 = 1.32;
    /// Bytes of one buffered change (a key slot).
    const CHANGE_BYTES: u64 = 24;
    /// Buffers and task of one connection (16 KiB read + 16 KiB write).
    const CONNECTION_BYTES: u64 = 40 << 10;
    /// Runtime, rules, throttled-keys sketch.
    const BASE_BYTES: u64 = 50 << 20;
    let n = |name: &str| c[name].as_u64().unwrap_or_else(|| panic!("{name} in {c}"));
    let stripes = n("stripes").next_power_of_two();
    (n("max-memory") as f64 * RESIDENT_PER_TABLE_BYTE) as u64
        + n("repl-buffer-cap") * stripes * CHANGE_BYTES
        + n("repl-backlog")
        + n("max-connections") * CONNECTION_BYTES
        + BASE_BYTES
}

#[test]
fn the_kubernetes_pair_matches_its_service_probes_rules_and_memory() {
    let d = read_all(&BTreeMap::new(), &operator_vars()).unwrap();
    let find = |kind: &str, name: &str| {
        d.objects
            .iter()
            .find(|o| o.kind() == kind && o.name() == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
    };
    let set = find("StatefulSet", "tollgate");
    let service_name = set.value["spec"]["serviceName"].as_str().unwrap();
    let service = &find("Service", service_name).value["spec"];
    assert_eq!(service["clusterIP"], "None", "a headless Service");

    let pods: Vec<_> = kube::pods(std::slice::from_ref(set));
    let mut nodes = Vec::new();
    for pod in &pods {
        for (key, value) in service["selector"].as_mapping().unwrap() {
            let (key, value) = (key.as_str().unwrap(), value.as_str().unwrap());
            assert_eq!(
                pod.labels.get(key).map(String::as_str),
                Some(value),
                "selector {key}"
            );
        }
        let [container] = kube::tollgate_containers(pod)[..] else {
            panic!("{}: one Tollgate container", pod.origin)
        };
        let launch = kube::launch(pod, container, &d.image, &d.objects).unwrap();
        let config = launch.print_config().unwrap();
        let listen = port_of(&config["listen"]);
        assert_eq!(
            config["advertise"],
            format!(
                "{}.{service_name}.{}.svc:{listen}",
                pod.name,
                kube::NAMESPACE
            ),
            "the pod's name under the headless Service"
        );
        let ports = container["ports"].as_sequence().unwrap();
        let port_named = |name: &str| {
            ports
                .iter()
                .find(|p| p["name"] == name)
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("no container port {name}")) as u16
        };
        assert_eq!(port_named("protocol"), listen);
        assert_eq!(port_named("admin"), port_of(&config["admin"]));
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let get = &container[probe]["httpGet"];
            assert_eq!(get["path"], path, "{probe}");
            assert_eq!(
                port_named(get["port"].as_str().unwrap()),
                port_of(&config["admin"])
            );
        }
        for port in service["ports"].as_sequence().unwrap() {
            port_named(port["targetPort"].as_str().unwrap());
        }

        // The rules file: a ConfigMap key under a mounted volume.
        let rules = Path::new(config["rules"].as_str().expect("a rules file"));
        let mount = container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| rules.starts_with(m["mountPath"].as_str().unwrap()))
            .expect("the rules file is mounted");
        let key = rules
            .strip_prefix(mount["mountPath"].as_str().unwrap())
            .unwrap();
        let volume = pod.spec["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("the mounted volume");
        let map = find("ConfigMap", volume["configMap"]["name"].as_str().unwrap());
        let text = map.value["data"][key.to_str().unwrap()]
            .as_str()
            .expect("the ConfigMap holds the rules file");
        assert_rules_valid(&launch.origin, text, &config);

        // Memory: the request covers what the settings let the node reach,
        // and the limit is the request (nothing to reclaim from a limiter).
        let resources = &container["resources"];
        let request = quantity_bytes(resources["requests"]["memory"].as_str().unwrap());
        let limit = quantity_bytes(resources["limits"]["memory"].as_str().unwrap());
        assert_eq!(request, limit);
        let budget = memory_budget(&config);
        assert!(
            budget <= request,
            "{budget} bytes reachable > {request} requested"
        );

        let security = &pod.spec["securityContext"];
        assert_eq!(security["runAsNonRoot"], true);
        let uid = d.image.user.as_deref().unwrap().split(':').next().unwrap();
        assert_eq!(security["runAsUser"].as_u64().unwrap().to_string(), uid);
        nodes.push((launch, config));
    }
    assert_pair(&nodes);
}

#[test]
fn the_compose_cluster_is_three_shards_of_two_nodes_on_its_etcd() {
    let deployment = read_all(&BTreeMap::new(), &operator_vars()).unwrap();
    let services = &deployment.compose[CLUSTER_COMPOSE];
    let launches: Vec<Launch> = services.iter().map(|s| s.launch.clone()).collect();
    let nodes = print_configs(&launches).unwrap();
    assert_eq!(nodes.len(), 6, "{nodes:?}");
    let text = std::fs::read_to_string(Path::new(ROOT).join(CLUSTER_COMPOSE)).unwrap();
    let doc: Value = serde_norway::from_str(&text).unwrap();
    let etcd = &doc["services"]["etcd"];
    assert!(etcd.is_mapping(), "an etcd service");
    let mut per_shard = BTreeMap::new();
    for (service, (_, config)) in services.iter().zip(&nodes) {
        let origin = &service.launch.origin;
        assert_eq!(config["cluster"], "demo", "{origin}");
        let endpoint = config["etcd"].as_str().expect("--etcd");
        let host = endpoint.split(':').next().unwrap();
        assert_eq!(
            etcd["hostname"].as_str(),
            Some(host),
            "{origin}: --etcd names the etcd service"
        );
        *per_shard
            .entry(config["shard"].as_u64().expect("--shard"))
            .or_insert(0) += 1;
        assert_eq!(config["auth-token"], "<redacted>", "{origin}: no auth");
        let advertise = config["advertise"].as_str().unwrap();
        assert_eq!(advertise, format!("{}:7700", service.name), "{origin}");
        for port in [port_of(&config["listen"]), port_of(&config["admin"])] {
            assert!(
                service.container_ports.contains(&port),
                "{origin}: {port} unpublished"
            );
        }
        assert!(config["peer"].is_null() && config["replica-of"].is_null());
    }
    assert_eq!(per_shard, BTreeMap::from([(0, 2), (1, 2), (2, 2)]));
}
