//! `tollgate cluster`: create a cluster in etcd (`init`), show it
//! (`status`), move slots between shards (`move-slots`). Each talks to
//! etcd directly (`crate::cluster`), never through a node; `status` also
//! asks each standby how far behind it is.

use crate::units::parse_duration;
use clap::{Args, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Create a cluster of N shards, the 16384 slots split evenly; refuses
    /// when the cluster exists.
    Init(InitArgs),
    /// Show the shards, their slot ranges, primaries and epochs, standbys
    /// and their lag, and the moves in progress.
    Status(StatusArgs),
    /// Move a range of slots to another shard: their states are copied to
    /// it, then ownership flips in one etcd transaction.
    MoveSlots(MoveArgs),
}

/// Which etcd, which cluster.
#[derive(Debug, Args)]
pub struct EtcdArgs {
    /// etcd members, HOST:PORT[,HOST:PORT...] (or http(s)://HOST:PORT).
    #[arg(long, value_name = "HOST:PORT[,...]", value_parser = etcd_list)]
    pub etcd: String,
    /// The cluster's name.
    #[arg(long, value_name = "NAME")]
    pub cluster: String,
    /// Give up after this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub access: crate::config::EtcdAccessArgs,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Number of shards (1 to 16384, one slot each at most).
    #[arg(long, value_parser = shard_count)]
    pub shards: u16,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Client token for the nodes' HELLO, to ask the standbys their lag
    /// (the servers' --auth-token).
    #[arg(long, env = "TOLLGATE_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The slots to move, `A-B` (inclusive) or one slot `A`; they must all
    /// belong to one shard.
    #[arg(long, value_name = "A-B")]
    pub slots: String,
    /// The shard that receives them.
    #[arg(long, value_name = "S")]
    pub to: u16,
}

/// `--shards`: 0 and too many are refused alike, with the control plane's
/// own words, before etcd is asked (a bad flag: exit 2).
fn shard_count(text: &str) -> Result<u16, String> {
    let max = crate::slot::SLOT_COUNT;
    match text.trim().parse::<u16>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("a cluster needs 1 to {max} shards, got {text}")),
    }
}

/// `--etcd`: each endpoint's form is checked as `serve --etcd`'s is, so
/// a port out of range is a bad flag, not a dial to port 80.
fn etcd_list(text: &str) -> Result<String, String> {
    let endpoints: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if endpoints.is_empty() {
        return Err("no etcd endpoint given".into());
    }
    for endpoint in endpoints {
        crate::addr::etcd_endpoint(endpoint).map_err(|why| format!("{endpoint:?}: {why}"))?;
    }
    Ok(text.to_owned())
}

pub(super) async fn run(args: ClusterArgs) -> ExitCode {
    #[cfg(feature = "cluster")]
    return imp::run(args).await;
    #[cfg(not(feature = "cluster"))]
    {
        let _ = args;
        eprintln!("error: this binary was built without cluster mode (cargo feature `cluster`)");
        ExitCode::from(2)
    }
}

#[cfg(feature = "cluster")]
mod imp {
    use super::*;
    use crate::cluster::{
        begin_move, init, load_topology, status, ClusterError, ClusterStatus, Etcd, EtcdSettings,
        Keyspace, ShardId, SlotRange,
    };
    use tokio::time::Instant;
    use tollgate_client::{Client, ClientConfig};

    pub async fn run(args: ClusterArgs) -> ExitCode {
        let result = match args.command {
            ClusterCommand::Init(a) => run_init(a).await,
            ClusterCommand::Status(a) => run_status(a).await,
            ClusterCommand::MoveSlots(a) => run_move(a).await,
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                match e {
                    // etcd answered: the request itself was refused.
                    ClusterError::ClusterExists { .. }
                    | ClusterError::NoCluster { .. }
                    | ClusterError::TopologyChanged { .. }
                    | ClusterError::Topology(_) => ExitCode::from(1),
                    _ => ExitCode::from(2),
                }
            }
        }
    }

    async fn connect(args: &EtcdArgs) -> Result<(Etcd, Keyspace), ClusterError> {
        let settings = EtcdSettings {
            request_timeout: args.timeout,
            connect_timeout: args.timeout,
            access: crate::node::etcd_access(&args.access),
            ..EtcdSettings::new(EtcdSettings::parse_endpoints(&args.etcd)?)
        };
        let keys = Keyspace::new(&args.cluster)?;
        Ok((Etcd::connect(&settings).await?, keys))
    }

    async fn run_init(args: InitArgs) -> Result<(), ClusterError> {
        let (etcd, keys) = connect(&args.etcd).await?;
        let (topology, version) = init(&etcd, &keys, args.shards).await?;
        println!(
            "cluster {} created: {} shards, topology version {version}",
            keys.cluster(),
            topology.shards.len()
        );
        for shard in &topology.shards {
            let slots: Vec<String> = shard.slots.iter().map(ToString::to_string).collect();
            println!("shard {}: slots {}", shard.id, slots.join(","));
        }
        Ok(())
    }

    async fn run_status(args: StatusArgs) -> Result<(), ClusterError> {
        let (etcd, keys) = connect(&args.etcd).await?;
        let status = status(&etcd, &keys).await?;
        let lags = standby_lags(
            &status,
            args.etcd.timeout.min(Duration::from_secs(1)),
            args.auth_token.as_deref(),
        )
        .await;
        if args.json {
            let mut v = serde_json::to_value(&status).expect("a status serializes");
            for (i, shard) in status.shards.iter().enumerate() {
                for (j, standby) in shard.standbys.iter().enumerate() {
                    v["shards"][i]["standbys"][j]["lag_ms"] =
                        lags.get(&standby.addr).copied().flatten().into();
                }
            }
            println!("{v}");
        } else {
            print!("{status}");
            for (addr, lag) in &lags {
                match lag {
                    Some(ms) => println!("standby {addr}: lag {ms} ms"),
                    None => println!("standby {addr}: not answering, or not in sync"),
                }
            }
        }
        Ok(())
    }

    /// Each standby's lag (STATUS `lag_ms`), None when it does not answer
    /// or is not in sync.
    async fn standby_lags(
        status: &ClusterStatus,
        timeout: Duration,
        auth_token: Option<&str>,
    ) -> std::collections::BTreeMap<String, Option<u64>> {
        let mut lags = std::collections::BTreeMap::new();
        for standby in status.shards.iter().flat_map(|s| &s.standbys) {
            let config = ClientConfig {
                deadline: timeout,
                connect_timeout: timeout,
                client_name: "tollgate-cli".into(),
                auth_token: auth_token.map(|t| t.as_bytes().to_vec()),
                ..ClientConfig::default()
            };
            let lag = match Client::new(standby.addr.clone(), config) {
                Ok(client) => {
                    let status = client.status().await.ok();
                    client.close();
                    status
                        .filter(|s| s.field("synced") == Some(1))
                        .and_then(|s| s.field("lag_ms"))
                }
                Err(_) => None,
            };
            lags.insert(standby.addr.clone(), lag);
        }
        lags
    }

    /// Records the move, then waits until the source primary has copied
    /// the slots' states and flipped their ownership.
    async fn run_move(args: MoveArgs) -> Result<(), ClusterError> {
        let slots: SlotRange = args.slots.parse()?;
        let to = ShardId(args.to);
        let (etcd, keys) = connect(&args.etcd).await?;
        let (_, version) = load_topology(&etcd, &keys).await?;
        let moving = begin_move(&etcd, &keys, slots, to, version).await?;
        println!("moving slots {slots} to shard {to} (topology version {moving})");
        // None: a --timeout past the clock's range, waited for as long.
        let deadline = Instant::now().checked_add(args.etcd.timeout);
        loop {
            let (topology, version) = load_topology(&etcd, &keys).await?;
            let pending = topology.moving.iter().any(|m| m.slots == slots);
            let owned = topology
                .shard(to)
                .is_some_and(|s| s.slots.iter().any(|r| r.covers(slots)));
            if !pending {
                if owned {
                    println!("slots {slots} belong to shard {to} (topology version {version})");
                    return Ok(());
                }
                return Err(ClusterError::Settings(format!(
                    "the move of slots {slots} was aborted (topology version {version})"
                )));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(ClusterError::Timeout {
                    op: "wait for the slot move",
                    after: args.etcd.timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
