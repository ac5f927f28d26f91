//! Real etcd members on loopback for the cluster tests: one member, or a
//! 3-member cluster (to kill the leader and to lose quorum). Each member
//! gets a temporary data directory and ports picked from the ephemeral
//! range; everything is killed and removed when the [`EtcdCluster`] is
//! dropped.
//!
//! etcd comes from `$ETCD_BIN` or `etcd` on the PATH (Debian's
//! `etcd-server`, installed by `scripts/deps.sh`). Without it every cluster
//! test fails with a message saying so: they never skip.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
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

    async fn start(n: usize) -> Self {
        let bin = etcd_bin();
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
                    &format!("http://{client}"),
                    "--advertise-client-urls",
                    &format!("http://{client}"),
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
                Member {
                    name: name.clone(),
                    client,
                    args,
                    child: None,
                    stopped: false,
                }
            })
            .collect();
        let mut cluster = EtcdCluster { bin, dir, members };
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

    /// A raw etcd-client connection to member `i` (for probing).
    async fn probe(&self, i: usize) -> Option<Client> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(1));
        Client::connect(
            [format!("http://{}", self.members[i].client)],
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
