//! Real etcd members on loopback for the cluster tests: one member, or a
//! 3-member cluster (to kill the leader and to lose quorum). Each member
//! gets a temporary data directory and ports picked from the ephemeral
//! range; everything is killed and removed when the [`EtcdCluster`] is
//! dropped.
//!
//! [`EtcdCluster::single_tls`] serves its client port over TLS only (and
//! asks clients for a certificate when given the CA to check them with).
//!
//! etcd comes from `$ETCD_BIN` or `etcd` on the PATH (Debian's
//! `etcd-server`, installed by `scripts/deps.sh`). Without it every cluster
//! test fails with a message saying so: they never skip.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use tokio::time::Instant;

/// Generous bound for etcd to start or elect a leader; never a pass/fail
/// timing, only a guard against hanging.
const PATIENCE: Duration = Duration::from_secs(60);

/// The etcd binary, checked to run.
fn etcd_bin() -> String {
    let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned());
    match Command::new(&bin).arg("--version").output() {
        Ok(out) if out.status.success() => bin,
        other => panic!(
            "cluster tests need etcd 3.4 or newer ({bin:?} does not run: {other:?}); \
             run scripts/deps.sh (Debian: apt-get install etcd-server) or set ETCD_BIN"
        ),
    }
}

use crate::procs::free_port;

struct Member {
    name: String,
    client: String,
    args: Vec<String>,
    child: Option<Child>,
    stopped: bool,
}

impl Member {
    fn spawn(&mut self, bin: &str) {
        let child = Command::new(bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn etcd {}: {e}", self.name));
        self.child = Some(child);
        self.stopped = false;
    }

    fn signal(&mut self, signal: &str) {
        let pid = self.child.as_ref().expect("member running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}");
    }
}

/// etcd members on loopback, killed and removed on drop.
pub struct EtcdCluster {
    bin: String,
    dir: PathBuf,
    members: Vec<Member>,
    /// How the harness's own probes reach a TLS client port.
    probe_tls: Option<TlsOptions>,
}

/// Client TLS of an etcd member: its certificate, and who it trusts.
pub struct ClientTls {
    /// PEM files of etcd's certificate (for 127.0.0.1) and key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// PEM of the CA that signed `cert` (the harness's probes trust it).
    pub ca_pem: String,
    /// With a CA file: etcd demands client certificates it signed
    /// (`--client-cert-auth`), and the probes present `probe` (PEM chain
    /// and key).
    pub client_ca: Option<PathBuf>,
    pub probe: Option<(String, String)>,
}

static CLUSTERS: AtomicUsize = AtomicUsize::new(0);

impl EtcdCluster {
    /// One member, ready to serve.
    pub async fn single() -> Self {
        Self::start(1).await
    }

    /// Three members, with a leader elected.
    pub async fn three() -> Self {
        Self::start(3).await
    }

    /// One member whose client port speaks TLS only, started with `extra`
    /// flags too.
    pub async fn single_tls(tls: ClientTls, extra: &[&str]) -> Self {
        Self::start_with(1, Some(tls), extra).await
    }

    async fn start(n: usize) -> Self {
        Self::start_with(n, None, &[]).await
    }

    async fn start_with(n: usize, tls: Option<ClientTls>, extra: &[&str]) -> Self {
        let bin = etcd_bin();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let dir = std::env::temp_dir().join(format!(
            "tollgate-etcd-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd data dir");
        let peers: Vec<(String, String)> = (0..n)
            .map(|i| (format!("m{i}"), format!("127.0.0.1:{}", free_port())))
            .collect();
        let initial = peers
            .iter()
            .map(|(name, peer)| format!("{name}=http://{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = dir.file_name().unwrap().to_string_lossy().into_owned();
        let members = peers
            .iter()
            .map(|(name, peer)| {
                let client = format!("127.0.0.1:{}", free_port());
                let data = dir.join(name);
                let args = [
                    "--name",
                    name,
                    "--data-dir",
                    &data.to_string_lossy(),
                    "--listen-client-urls",
                    &format!("{scheme}://{client}"),
                    "--advertise-client-urls",
                    &format!("{scheme}://{client}"),
                    "--listen-peer-urls",
                    &format!("http://{peer}"),
                    "--initial-advertise-peer-urls",
                    &format!("http://{peer}"),
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-token",
                    &token,
                    "--initial-cluster-state",
                    "new",
                    "--logger",
                    "zap",
                    "--log-level",
                    "error",
                ]
                .map(str::to_owned)
                .to_vec();
                let mut args = args;
                args.extend(tls.as_ref().map(tls_args).unwrap_or_default());
                args.extend(extra.iter().map(|s| s.to_string()));
                Member {
                    name: name.clone(),
                    client,
                    args,
                    child: None,
                    stopped: false,
                }
            })
            .collect();
        let probe_tls = tls.map(|t| {
            let options = TlsOptions::new().ca_certificate(Certificate::from_pem(&t.ca_pem));
            match &t.probe {
                Some((chain, key)) => options.identity(Identity::from_pem(chain, key)),
                None => options,
            }
        });
        let mut cluster = EtcdCluster {
            bin,
            dir,
            members,
            probe_tls,
        };
        for i in 0..n {
            cluster.members[i].spawn(&cluster.bin);
        }
        cluster.wait_for_leader().await;
        cluster
    }

    /// `HOST:PORT` of every member's client port.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client.clone()).collect()
    }

    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].client.clone()
    }

    /// A raw etcd-client connection to member `i` (for probing; over TLS
    /// with the probe's certificate when the client port speaks TLS).
    pub async fn probe(&self, i: usize) -> Option<Client> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(1));
        let mut scheme = "http";
        if let Some(tls) = &self.probe_tls {
            options = options.with_tls(tls.clone());
            scheme = "https";
        }
        Client::connect(
            [format!("{scheme}://{}", self.members[i].client)],
            Some(options),
        )
        .await
        .ok()
    }

    /// The index of the member that is leader, asked of the members still
    /// running; None while there is none.
    pub async fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() || self.members[i].stopped {
                ids.push(None);
                continue;
            }
            let status = match self.probe(i).await {
                Some(mut c) => c.status().await.ok(),
                None => None,
            };
            ids.push(
                status
                    .as_ref()
                    .and_then(|s| s.header().map(|h| h.member_id())),
            );
            if let Some(s) = status.filter(|s| s.leader() != 0) {
                leader = Some(s.leader());
            }
        }
        let leader = leader?;
        ids.iter().position(|id| *id == Some(leader))
    }

    /// Waits until a running member reports a leader that is running too.
    pub async fn wait_for_leader(&self) -> usize {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(i) = self.leader().await {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "etcd elected no leader in {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL of member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            child.kill().expect("SIGKILL etcd");
            child.wait().expect("reap etcd");
        }
    }

    /// Starts member `i` again (same name, data and ports).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        let bin = self.bin.clone();
        self.members[i].spawn(&bin);
    }

    /// SIGSTOP of member `i`: it holds its sockets and answers nothing.
    pub fn pause(&mut self, i: usize) {
        self.members[i].signal("-STOP");
        self.members[i].stopped = true;
    }

    /// SIGCONT of a paused member.
    pub fn resume(&mut self, i: usize) {
        self.members[i].signal("-CONT");
        self.members[i].stopped = false;
    }
}

/// etcd's flags for `tls`.
fn tls_args(tls: &ClientTls) -> Vec<String> {
    let mut args = vec![
        "--cert-file".to_owned(),
        tls.cert.to_string_lossy().into_owned(),
        "--key-file".to_owned(),
        tls.key.to_string_lossy().into_owned(),
    ];
    if let Some(ca) = &tls.client_ca {
        args.extend([
            "--client-cert-auth".to_owned(),
            "--trusted-ca-file".to_owned(),
            ca.to_string_lossy().into_owned(),
        ]);
    }
    args
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                // SIGKILL ends a stopped process too.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
