//! Cluster mode: the etcd control plane (feature `cluster`).
//!
//! Who owns which slots, who is each shard's primary, and at which epoch,
//! is decided by etcd, never by the nodes among themselves: no gossip, no
//! home-made election. This module is everything a node (and the CLI)
//! needs from etcd, and nothing of the data path:
//!
//! - [`Keyspace`]: the keys under `/tollgate/<cluster>/` (`keys.rs` has
//!   the table);
//! - [`Topology`]: 16384 slots -> shards as ranges, moves in progress;
//!   versioned by its key's `mod_revision`;
//! - [`Member`]: a node's registration bound to its etcd lease, the lease's
//!   renewal, and its shard's primary election (the primary key's
//!   `create_revision` is the shard's **epoch**, the fencing token);
//! - [`LeaseDeadline`]: until when the node *knows* its lease is valid, on
//!   the monotonic clock; a primary serves writes only before it;
//! - [`ClusterView`] -> [`RoutingTable`]: a watch-fed mirror of etcd the
//!   check path reads with one atomic load (slot -> shard -> primary);
//! - `admin`: `cluster init`, `cluster status`, slot moves as transactions
//!   conditioned on the topology version.
//!
//! The rules that make it safe (docs/CLUSTER.md has the full argument):
//! 1. A node serves writes for shard S only while it holds `primary/S` and
//!    its lease deadline (last acknowledged renewal's send time + TTL -
//!    margin) has not passed. etcd expires the lease no earlier than that,
//!    so two nodes never serve the same shard's writes at the same instant
//!    (given the clocks' rates differ by less than the margin per TTL).
//! 2. Epochs only grow (etcd revisions), so anything stamped with an older
//!    epoch (a replication stream, an answer) is recognisably stale.
//! 3. A slot is served by nobody while it moves; its ownership flips in one
//!    transaction conditioned on the topology version.
//!
//! # Layout
//!
//! ```text
//!  etcd --watch--> ClusterView (Mirror) --ArcSwap--> RoutingTable <-- check path
//!  etcd <--renew-- Member (lease) --------> LeaseDeadline (atomic) <-- check path
//!  etcd <--txn---- Member::campaign / admin::{init, begin_move, complete_move}
//! ```

mod access;
mod admin;
mod error;
mod etcd;
mod keys;
mod lease;
mod member;
mod routing;
mod settings;
mod topology;
mod view;

pub use access::{EtcdAccess, EtcdAccessError};
pub use admin::{
    abort_move, begin_move, complete_move, init, load_topology, replace_topology, status,
    ClusterStatus, Fence,
};
pub use error::ClusterError;
pub use etcd::Etcd;
pub use keys::{KeyKind, Keyspace, MAX_CLUSTER_NAME_LEN};
pub use lease::LeaseDeadline;
pub use member::{Campaign, Member, NodeRecord, PrimaryRecord};
pub use routing::{PrimaryRoute, Route, RoutingTable, ShardRoute, Unavailable};
pub use settings::{
    EtcdSettings, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_LEASE_MARGIN,
    DEFAULT_LEASE_TTL, DEFAULT_REQUEST_TIMEOUT,
};
pub use topology::{ShardId, ShardSpec, SlotMove, SlotRange, Topology, TopologyError, MAX_SHARDS};
pub use view::ClusterView;
