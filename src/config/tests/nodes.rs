//! The settings that name other nodes and etcd: addresses that cannot be
//! dialled, a node following itself, a lease etcd would not grant.

use super::*;

/// A cluster-mode node's settings that validate (with the feature).
fn cluster_node() -> ServerConfig {
    let mut c = ServerConfig::with_listen("127.0.0.1:7700".parse().unwrap());
    c.cluster.etcd = Some("127.0.0.1:2379".into());
    c.cluster.cluster = Some("prod".into());
    c.cluster.shard = Some(0);
    c.auth.cluster_secret = Some("cluster-secret-for-tests".into());
    c
}

/// A pair-mode node's settings that validate.
fn pair_node() -> ServerConfig {
    let mut c = ServerConfig::with_listen("127.0.0.1:7700".parse().unwrap());
    c.auth.cluster_secret = Some("cluster-secret-for-tests".into());
    c
}

fn address_error(c: &ServerConfig) -> &'static str {
    match c.validate() {
        Err(ConfigError::Address { flag, .. }) => flag,
        other => panic!("expected an address error, got {other:?}"),
    }
}

#[test]
fn etcd_endpoints_need_a_port_in_range() {
    let mut c = cluster_node();
    for bad in ["127.0.0.1:99999", "127.0.0.1:2379,notahost", "http://h:0"] {
        c.cluster.etcd = Some(bad.into());
        assert_eq!(address_error(&c), "etcd", "{bad}");
    }
    #[cfg(feature = "cluster")]
    for good in ["etcd-0:2379, etcd-1:2379", "https://10.0.0.1:2379"] {
        c.cluster.etcd = Some(good.into());
        assert_eq!(c.validate(), Ok(()), "{good}");
    }
}

#[test]
fn an_advertised_address_must_be_dialable() {
    let mut c = cluster_node();
    for bad in ["notanaddr", "0.0.0.0:0", "0.0.0.0:7700", "10.0.0.1:0"] {
        c.replication.advertise = Some(bad.into());
        assert_eq!(address_error(&c), "advertise", "{bad}");
    }
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("--advertise \"10.0.0.1:0\""), "{err}");
    let mut p = pair_node();
    p.replication.advertise = Some("[::]:7700".into());
    assert_eq!(address_error(&p), "advertise");
    p.replication.advertise = Some("node-a.internal:7700".into());
    assert_eq!(p.validate(), Ok(()));
}

#[test]
fn a_node_cannot_be_its_own_primary_or_peer() {
    let mut c = pair_node();
    c.replication.replica_of = Some("127.0.0.1:7700".into());
    assert_eq!(
        c.validate(),
        Err(ConfigError::ItsOwnPeer {
            flag: "replica-of",
            value: "127.0.0.1:7700".into()
        })
    );
    c.replication.replica_of = Some("127.0.0.1:7710".into());
    assert_eq!(c.validate(), Ok(()));
    c.replication.peer = Some("localhost:7700".into());
    assert!(matches!(
        c.validate(),
        Err(ConfigError::ItsOwnPeer { flag: "peer", .. })
    ));
    // Listening on every address, named by its --advertise.
    let mut c = pair_node();
    c.network.listen = "0.0.0.0:7700".parse().unwrap();
    c.auth.insecure = true;
    c.replication.advertise = Some("node-a.internal:7700".into());
    c.replication.replica_of = Some("node-a.internal:7700".into());
    assert!(matches!(
        c.validate(),
        Err(ConfigError::ItsOwnPeer {
            flag: "replica-of",
            ..
        })
    ));
    c.replication.replica_of = Some("notanaddr".into());
    assert_eq!(address_error(&c), "replica-of");
    c.replication.replica_of = Some("node-b.internal:7700".into());
    assert_eq!(c.validate(), Ok(()));
}
