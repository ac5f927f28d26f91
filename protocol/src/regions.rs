//! The usage exchange between regions, as Rust values (`PROTOCOL.md` §16):
//! USAGE and its answer USAGE_OK.
//!
//! A limit marked global is enforced by each region on its own counters;
//! every exchange interval a region sends each other region the usage its
//! own clients made of global keys since the previous message, and the
//! receiver charges that usage into its counters without a decision of its
//! own. Messages to one receiver are numbered within a *session* (a random
//! id the sender draws each time it starts exchanging), so a message sent
//! again after a lost answer is recognised and not applied twice.
//!
//! Only node and region connections (HELLO proving the cluster or region
//! secret, [`crate::node_auth`]) may send USAGE.

use crate::message::limit::RuleName;
use bytes::Bytes;

/// Longest region name, in bytes (the shortest is 1).
pub const MAX_REGION_NAME_LEN: usize = 64;

/// The region names the reference server takes: 1 to 64 bytes out of
/// `A-Z a-z 0-9 _ - .` (the wire takes any UTF-8 of that length), safe in
/// a metric label and a log line.
pub fn valid_region_name(name: &str) -> bool {
    (1..=MAX_REGION_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Bytes of a USAGE payload before its entries, for a region name of
/// `region_len` bytes: `region_len`, the name, session, seq, sent_at, n.
pub const fn usage_header_len(region_len: usize) -> usize {
    1 + region_len + 8 + 8 + 8 + 4
}

/// USAGE (`0x20`): the usage one region's clients made of global keys since
/// the sender's previous message to this receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReport {
    /// The sending region (1 to 64 bytes of UTF-8).
    pub region: String,
    /// Non-zero; new each time the sender starts exchanging.
    pub session: u64,
    /// 1 for the first message of a session to this receiver, then one more
    /// for each message.
    pub seq: u64,
    /// The sender's clock when it built the message (ns since the UNIX
    /// epoch): how fresh the receiver's view of the sender's usage is.
    pub sent_at: u64,
    pub entries: Vec<UsageEntry>,
}

/// The usage of one key under one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEntry {
    pub key: Bytes,
    /// The global rule the key was checked with.
    pub rule: RuleName,
    /// Units admitted in the sender's region.
    pub charged: u64,
    /// Units given back there (REFUND).
    pub refunded: u64,
    /// The sender's clock at the latest of those admissions.
    pub at: u64,
}

impl UsageEntry {
    /// Bytes this entry takes on the wire.
    pub fn wire_len(&self) -> usize {
        Self::encoded_len(&self.key, &self.rule)
    }

    /// Bytes an entry of `key` under `rule` takes on the wire.
    pub fn encoded_len(key: &[u8], rule: &RuleName) -> usize {
        2 + key.len() + 1 + rule.len() + 8 + 8 + 8
    }
}

/// USAGE_OK (`0xA0`): a USAGE was taken in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageAck {
    /// The answering region, so a sender notices an address that leads to
    /// another region than it meant.
    pub region: String,
    /// The `seq` of the USAGE this answers. The receiver has applied every
    /// message of the session up to it.
    pub seq: u64,
    /// True when the message had been applied before (a retry): nothing
    /// was charged this time.
    pub duplicate: bool,
}
