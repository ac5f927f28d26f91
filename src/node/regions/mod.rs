//! Global limits: this node's region and the usage it exchanges with the
//! other regions (docs/GLOBAL-LIMITS.md, PROTOCOL.md §16).
//!
//! ```text
//!  check path (server) --record_all, once per frame--> the shared journal,
//!      one entry per key for all peers
//!  exchange task per peer (exchange.rs): every interval, the shared
//!      journal is shared out (outbox.rs): sealed once into USAGE messages
//!      (at most `exchange-max-bytes`) for every peer keeping up, copied
//!      into the journal of each peer behind (its rules' entries; new keys
//!      dropped past `region-journal-max-bytes` with what else waits)
//!  each sender: its sealed messages, then its journal -> its pending
//!      -> one USAGE -> USAGE_OK
//!  USAGE from a peer (server) --receive--> at-most-once -> Store::absorb
//!  monitor: who is stalled -> the stalled peers' bits the check path
//!      reads (a rule is capped by who among its own peers is stalled)
//! ```
//!
//! Invariants:
//! - a region reports only its own clients' usage (what the check path
//!   records), never what it absorbed from others, so nothing counts twice;
//! - a USAGE is applied at most once per (sender, session, seq); a retry is
//!   answered `duplicate`;
//! - `record_all` and `capped` are on the request path: one short lock
//!   per frame and one entry per key however many peers the rule lists,
//!   one atomic load;
//! - the node never sees rules: the server resolves a rule name to its
//!   limit (and whether it is global for the sender) through a closure.

mod exchange;
mod journal;
mod metrics;
mod outbox;
mod share;
mod spares;

pub(crate) use exchange::run;

use crate::clock::Nanos;
use crate::config::{ceiling_share, CutOff, RegionPeer, RegionSettings};
use crate::store::{RemoteUsage, Store, TableHint};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};
use journal::{Journal, JournalHasher};
use metrics::RegionMetrics;
use outbox::{Buffers, Outbox};
use prometheus::Registry;
use serde::Serialize;
use smallvec::SmallVec;
use spares::Spares;
use std::time::Duration;
use tollgate_protocol::{Limit, RuleName, UsageAck, UsageReport, MIN_FRAME_BODY};

/// What the regions layer is built from (the server's `RegionSettings`,
/// parsed).
#[derive(Debug, Clone)]
pub(crate) struct RegionConfig {
    pub region: String,
    pub peers: Vec<RegionPeer>,
    pub interval: Duration,
    pub stall_intervals: u32,
    pub max_message_bytes: usize,
    /// `--region-ceiling`: None, an equal share of a rule's regions.
    pub ceiling_share: Option<f64>,
    /// `--region-cut-off`.
    pub cut_off: CutOff,
    /// The bytes one peer's journal, the messages sealed for it and its
    /// sender's pending usage may take together.
    pub journal_max_bytes: usize,
}

impl RegionConfig {
    /// None when the node is in no region.
    pub fn from_settings(s: &RegionSettings, max_frame: u32) -> Option<Self> {
        let region = s.region.clone()?;
        Some(Self {
            region,
            // Validated at start.
            peers: s.peers().unwrap_or_default(),
            interval: s.exchange_interval,
            stall_intervals: s.region_stall_intervals,
            // A frame's body is the opcode and the request id, then the
            // message: capped at the frame alone, a full message (the
            // defaults: 1 MiB each) was refused FrameTooLarge, resent as
            // it was, and the exchange with that peer never resumed.
            max_message_bytes: s
                .exchange_max_bytes
                .min((max_frame as usize).saturating_sub(MIN_FRAME_BODY as usize)),
            ceiling_share: s.region_ceiling,
            cut_off: s.region_cut_off,
            journal_max_bytes: s.region_journal_max_bytes,
        })
    }
}

/// One peer region as this node sees it.
pub(crate) struct Peer {
    pub config: RegionPeer,
    /// Its share of the shared journal, as messages or as a journal, not
    /// yet taken by its sender.
    outbox: Mutex<Outbox>,
    /// What waits for it ([`Outbox::held`]; changed under the outbox's
    /// lock; an upper bound between a seal and the sender's next word),
    /// which stays within `journal_max_bytes`.
    held: AtomicUsize,
    /// Its `entries_dropped` and `usage_dropped` series, at hand for the
    /// check path.
    dropped: (prometheus::IntCounter, prometheus::IntCounter),
    /// Clock (ns) of the last USAGE it answered, and of the last USAGE from
    /// it; the start time until then.
    last_acked: AtomicU64,
    last_received: AtomicU64,
    /// The session and highest seq applied from it (at most once).
    applied: Mutex<Option<(u64, u64)>>,
    /// Whether the exchange with it is stalled (the monitor's view).
    stalled: AtomicBool,
    /// USAGE messages it answered (applied or duplicate).
    acked: AtomicU64,
    /// The largest message it takes: its HELLO_OK's `max_frame` less the
    /// opcode and request id, learned by its sender at each handshake;
    /// unbounded until then (the message size `--exchange-max-bytes` caps
    /// alone).
    max_message: AtomicUsize,
}

/// Why a USAGE is refused: nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UsageRefusal {
    #[error("region {0:?} is not one this node exchanges usage with (--region-peer)")]
    UnknownRegion(String),
    #[error("session 0 is not a session")]
    ZeroSession,
    /// A session older than the one the region sends in now (a message
    /// from before its restart, or another sender claiming the region).
    #[error(
        "session {session} of region {region:?} is older than its session {newest}, which is live"
    )]
    OlderSession {
        region: String,
        session: u64,
        newest: u64,
    },
}

/// How a rule name resolves on the receiver: the limit, when the rule
/// exists, is global and lists the sender's region.
pub(crate) type Resolve<'a> = &'a dyn Fn(&RuleName, &str) -> Option<Limit>;

/// One check's usage of a key under a global rule, as the check path
/// hands it to [`Regions::record_all`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recorded<'f> {
    /// Borrowed from the request frame: copied only when new to the journal.
    pub key: &'f [u8],
    pub rule: &'f RuleName,
    /// The peers the rule lists ([`Regions::peers_of`]); 0: none, nothing
    /// is recorded.
    pub peers: u64,
    pub charged: u64,
    pub refunded: u64,
}

/// The regions layer of a node.
pub(crate) struct Regions {
    pub config: RegionConfig,
    peers: Vec<Peer>,
    /// What the check path recorded since a sender last shared it out.
    shared: Mutex<Journal>,
    /// Where the shared journal's table is, read without its lock to
    /// prefetch where a check's usage will be recorded
    /// ([`Regions::prefetch_record`]); published under the lock whenever
    /// the table moved.
    shared_hint: TableHint,
    /// When it was last shared out (clock, ns).
    shared_at: AtomicU64,
    store: std::sync::Arc<Store>,
    /// The peers the exchange is stalled with, as bits (bit `i`: peer `i`),
    /// for the check path to judge each rule by its own peers.
    stalled: AtomicU64,
    /// Set while the region is cut off: a rule listing every region is
    /// capped ([`Regions::capped`] of all the peers).
    cut_off: AtomicBool,
    metrics: RegionMetrics,
    /// The hasher of every journal here, the senders' pending ones too.
    hasher: JournalHasher,
    /// Emptied journals, for the next interval's usage.
    spares: Spares,
    /// Buffers of messages done with, for the next ones.
    buffers: Buffers,
}

impl Regions {
    pub fn new(
        config: RegionConfig,
        store: std::sync::Arc<Store>,
        now: Nanos,
        registry: &Registry,
    ) -> prometheus::Result<Self> {
        let metrics = RegionMetrics::register(registry)?;
        let peers = config
            .peers
            .iter()
            .map(|p| Peer {
                config: p.clone(),
                outbox: Mutex::new(Outbox::default()),
                held: AtomicUsize::new(0),
                dropped: {
                    let m = metrics.peer(&p.name);
                    (m.entries_dropped, m.units_dropped)
                },
                last_acked: AtomicU64::new(now),
                last_received: AtomicU64::new(now),
                applied: Mutex::new(None),
                stalled: AtomicBool::new(false),
                acked: AtomicU64::new(0),
                max_message: AtomicUsize::new(usize::MAX),
            })
            .collect();
        Ok(Self {
            peers,
            shared: Mutex::new(Journal::default()),
            shared_hint: Journal::new_hint(),
            shared_at: AtomicU64::new(0),
            store,
            stalled: AtomicU64::new(0),
            cut_off: AtomicBool::new(false),
            metrics,
            hasher: JournalHasher::default(),
            spares: Spares::new(config.peers.len() + 1),
            // Those of a backlog's messages in flight to every peer at once.
            buffers: Buffers::new(4 * (config.peers.len() + 1)),
            config,
        })
    }

    /// This node's region.
    pub fn name(&self) -> &str {
        &self.config.region
    }

    /// The peers `regions` (a global rule's list) names, as bits (bit `i`:
    /// peer `i`); 0 when it names none of them.
    pub fn peers_of(&self, regions: &[String]) -> u64 {
        self.peers
            .iter()
            .enumerate()
            .filter(|(_, p)| regions.contains(&p.config.name))
            .fold(0, |bits, (i, _)| bits | 1 << i)
    }

    /// Records the usage of `key` under the global `rule` by this region's
    /// own clients, for each peer region the rule lists (`regions`): one
    /// [`Regions::record_all`] of one check.
    #[cfg(test)]
    pub fn record(
        &self,
        key: &[u8],
        rule: &RuleName,
        regions: &[String],
        charged: u64,
        refunded: u64,
        now: Nanos,
    ) {
        let peers = self.peers_of(regions);
        self.record_all(
            &[Recorded {
                key,
                rule,
                peers,
                charged,
                refunded,
            }],
            now,
        );
    }

    /// Records the usage of a frame's checks under global rules, in their
    /// order, under one lock of the shared journal: one entry per key and
    /// rule, whatever the number of peers. A key new to the journal is
    /// taken while it fits beside what the peer with the most room holds
    /// (`journal_max_bytes` in all), else dropped and counted for every
    /// peer listed; the peers with less room drop it, and count it, as
    /// they take their share.
    ///
    /// A frame's records go in together because each lock's release waited
    /// on the entry just written: recorded one check at a time, the
    /// release was 6.6% of the server's CPU under a global rule (in perf),
    /// each write's cache miss taken alone. Together, the writes' misses
    /// overlap and one release waits for them all.
    pub fn record_all(&self, records: &[Recorded<'_>], now: Nanos) {
        // Hashed, and the room looked up, before the lock (both read no
        // journal): the lock is held for the journal's own work only.
        let prepared: SmallVec<[(u64, usize); 16]> = records
            .iter()
            .map(|r| (self.hasher.hash(r.key, r.rule), self.least_held(r.peers)))
            .collect();
        let mut dropped = SmallVec::<[usize; 4]>::new();
        {
            let mut shared = self.shared.lock();
            let room_before = shared.capacity();
            for (i, (r, &(hash, least_held))) in records.iter().zip(&prepared).enumerate() {
                if r.peers == 0 {
                    continue;
                }
                let room = (self.config.journal_max_bytes.saturating_sub(least_held))
                    .saturating_sub(shared.bytes());
                let entry = (hash, r.key, r.rule, r.peers);
                if !shared.add(entry, (r.charged, r.refunded, now), room) {
                    dropped.push(i);
                }
            }
            // Moved, or published empty (a table's place is read from an
            // entry it holds, so a spare put in at the share-out is
            // published with its first entries).
            if shared.capacity() != room_before || !self.shared_hint.is_set() {
                shared.publish(&self.shared_hint);
            }
        }
        for r in dropped.into_iter().map(|i| &records[i]) {
            for (i, peer) in self.peers.iter().enumerate() {
                if r.peers & (1 << i) != 0 {
                    peer.dropped.0.inc();
                    peer.dropped.1.inc_by(r.charged.saturating_add(r.refunded));
                }
            }
        }
    }

    /// Starts fetching where the usage of `key` under the global `rule`
    /// will be recorded in the shared journal: called by a frame's
    /// prefetch, it lets the record's cache misses (the table's control
    /// group, the entry written) overlap with the frame's others rather
    /// than each wait alone under the journal's lock (the record was 11%
    /// of the server's CPU under a global rule, in perf, most of it those
    /// two misses). A stale hint only wastes a fetch.
    pub fn prefetch_record(&self, key: &[u8], rule: &RuleName) {
        self.shared_hint.prefetch(self.hasher.hash(key, rule));
    }

    /// The least any of `peers` (bits) holds: the bound a key new to the
    /// shared journal must fit beside (Relaxed: a bound, read again exactly
    /// as shares are taken).
    fn least_held(&self, peers: u64) -> usize {
        self.peers
            .iter()
            .enumerate()
            .filter(|(i, _)| peers & (1 << i) != 0)
            .map(|(_, p)| p.held.load(Ordering::Relaxed))
            .min()
            .unwrap_or(usize::MAX)
    }

    /// Whether the region is cut off as a rule listing every region sees
    /// it: stalled with a majority of its peers (or with any, under
    /// `--region-cut-off any`). What `GET /v1/regions` shows.
    pub fn cut_off(&self) -> bool {
        // Relaxed: a flag of its own; a check racing the change may go
        // either way.
        self.cut_off.load(Ordering::Relaxed)
    }

    /// Whether a global rule shared with `peers` (bits, [`Regions::peers_of`])
    /// is capped at this region's ceiling now: the exchange is stalled with
    /// a majority of those peers (or any of them, `--region-cut-off any`).
    /// Judged by the rule's own peers, so that a rule shared by two of
    /// three regions is capped when those two lose each other, whoever
    /// else is still heard. One atomic load.
    pub fn capped(&self, peers: u64) -> bool {
        // Relaxed: bits of their own; a check racing the change may go
        // either way.
        let stalled = self.stalled.load(Ordering::Relaxed) & peers;
        stalled != 0
            && self
                .config
                .cut_off
                .applies(stalled.count_ones(), peers.count_ones())
    }

    /// The limit a global rule's ceiling key is checked against: the
    /// region's share of the count (and of a bucket's burst), at least 1.
    /// `regions`: how many regions the rule lists (the default share is an
    /// equal one of them).
    pub fn ceiling(&self, limit: &Limit, regions: usize) -> Limit {
        let part = ceiling_share(self.config.ceiling_share, regions);
        // `as` truncates toward zero: the floor of a share, which is never
        // negative (an `f64::floor` call was 1% of the server's CPU under a
        // global rule, in perf: a library call, not an instruction, on the
        // baseline x86_64 target).
        let share = |n: u64| ((n as f64 * part) as u64).max(1);
        Limit {
            count: share(limit.count),
            burst: if limit.burst == 0 {
                0
            } else {
                share(limit.burst)
            },
            ..*limit
        }
    }

    /// Counts a check denied by the ceiling.
    pub fn ceiling_denied(&self) {
        self.metrics.ceiling_denied.inc();
    }

    /// Applies a USAGE from another region (at most once) and answers it.
    pub fn receive(
        &self,
        report: &UsageReport,
        resolve: Resolve<'_>,
        now: Nanos,
    ) -> Result<UsageAck, UsageRefusal> {
        if report.session == 0 {
            return Err(UsageRefusal::ZeroSession);
        }
        let peer = self
            .peers
            .iter()
            .find(|p| p.config.name == report.region)
            .ok_or_else(|| UsageRefusal::UnknownRegion(report.region.clone()))?;
        let ack = |duplicate| UsageAck {
            region: self.config.region.clone(),
            seq: report.seq,
            duplicate,
        };
        // Held while applying, so a retry racing its original on another
        // connection waits and is then seen as a duplicate.
        let mut applied = peer.applied.lock();
        if let Some((session, seq)) = *applied {
            if session == report.session && report.seq <= seq {
                return Ok(ack(true));
            }
            // Sessions are the sender's start time: an older one is a
            // sender that has been replaced, unless the newer has gone
            // silent (a restart whose clock stepped back must not be shut
            // out for good).
            let silent = peer.last_received.load(Ordering::Relaxed)
                < now.saturating_sub(self.stall_after().as_nanos() as u64);
            if report.session < session && !silent {
                return Err(UsageRefusal::OlderSession {
                    region: report.region.clone(),
                    session: report.session,
                    newest: session,
                });
            }
        }
        let name = peer.config.name.as_str();
        let labels = self.metrics.peer(name);
        for entry in &report.entries {
            let Some(limit) = resolve(&entry.rule, name) else {
                labels.skipped.inc();
                continue;
            };
            let usage = RemoteUsage {
                charged: entry.charged,
                refunded: entry.refunded,
                at: entry.at,
            };
            match self.store.absorb(&entry.key, &limit, usage, now) {
                Ok(_) => {
                    labels.keys_received.inc();
                    labels.units_imported.inc_by(entry.charged);
                }
                Err(e) => {
                    tracing::debug!(region = name, error = %e, "remote usage not absorbed");
                    labels.skipped.inc();
                }
            }
        }
        *applied = Some((report.session, report.seq));
        peer.last_received.fetch_max(now, Ordering::Relaxed);
        Ok(ack(false))
    }

    /// Re-reads who is stalled; called every interval by the monitor.
    /// Returns whether the region is cut off now.
    fn assess(&self, now: Nanos) -> bool {
        let limit = self.stall_after().as_nanos() as u64;
        let mut stalled = 0u64;
        for (i, peer) in self.peers.iter().enumerate() {
            let lag = peer.lag(now);
            self.metrics
                .peer(&peer.config.name)
                .lag
                .set(lag as f64 / 1e9);
            let s = lag > limit;
            // Said when it changes: rules shared with this peer may be
            // capped from here on (by their own peers, whether or not the
            // region is cut off as a whole).
            match (peer.stalled.swap(s, Ordering::Relaxed), s) {
                (false, true) => tracing::warn!(
                    region = %self.config.region,
                    peer = %peer.config.name,
                    lag_ms = lag / 1_000_000,
                    "usage exchange with a peer region stalled: global rules shared with it may be capped at this region's ceiling"
                ),
                (true, false) => tracing::info!(
                    region = %self.config.region,
                    peer = %peer.config.name,
                    "usage exchange with a peer region back in step"
                ),
                _ => {}
            }
            stalled |= u64::from(s) << i;
        }
        self.stalled.store(stalled, Ordering::Relaxed);
        let cut_off = self.capped(self.all_peers());
        let stalled = stalled.count_ones();
        let was = self.cut_off.swap(cut_off, Ordering::Relaxed);
        if cut_off && !was {
            tracing::warn!(
                region = %self.config.region,
                stalled,
                "usage exchange stalled with most peer regions: global rules capped at this region's ceiling"
            );
            self.metrics.ceiling_activations.inc();
        } else if was && !cut_off {
            tracing::info!(region = %self.config.region, "usage exchange back in step");
        }
        self.metrics.cut_off.set(i64::from(cut_off));
        cut_off
    }

    /// The largest USAGE message for every peer of `peers` (bits): the
    /// message size this node is configured with, and what each of them
    /// said it takes at its last handshake (PROTOCOL.md §16: a USAGE fits
    /// the receiver's `max_frame`).
    pub(super) fn message_cap(&self, peers: u64) -> usize {
        (self.peers.iter().enumerate())
            .filter(|(i, _)| peers & (1 << i) != 0)
            .map(|(_, p)| p.max_message.load(Ordering::Relaxed))
            .fold(self.config.max_message_bytes, usize::min)
    }

    /// Every peer, as bits.
    fn all_peers(&self) -> u64 {
        // At most 64 peers (`MAX_REGION_PEERS`).
        (0..self.peers.len()).fold(0, |bits, i| bits | 1 << i)
    }

    fn stall_after(&self) -> Duration {
        self.config.interval * self.config.stall_intervals
    }

    /// What `GET /v1/regions` shows.
    pub fn status(&self, now: Nanos) -> RegionsStatus {
        RegionsStatus {
            region: self.config.region.clone(),
            exchange_interval_ms: self.config.interval.as_millis() as u64,
            stall_after_ms: self.stall_after().as_millis() as u64,
            ceiling_share: ceiling_share(self.config.ceiling_share, self.peers.len() + 1),
            cut_off: self.cut_off(),
            peers: self
                .peers
                .iter()
                .map(|p| {
                    let m = self.metrics.peer(&p.config.name);
                    PeerStatus {
                        region: p.config.name.clone(),
                        addr: p.config.addr.clone(),
                        lag_ms: p.lag(now) / 1_000_000,
                        last_acked_ms_ago: now.saturating_sub(p.last_acked.load(Ordering::Relaxed))
                            / 1_000_000,
                        last_received_ms_ago: now
                            .saturating_sub(p.last_received.load(Ordering::Relaxed))
                            / 1_000_000,
                        stalled: p.stalled.load(Ordering::Relaxed),
                        messages_acked: p.acked.load(Ordering::Relaxed),
                        keys_sent: m.keys_sent.get(),
                        keys_received: m.keys_received.get(),
                        units_imported: m.units_imported.get(),
                    }
                })
                .collect(),
        }
    }
}

impl Peer {
    /// How long since the exchange with this peer last worked both ways
    /// (ns): the older of its last answer and its last USAGE.
    fn lag(&self, now: Nanos) -> u64 {
        let acked = self.last_acked.load(Ordering::Relaxed);
        let received = self.last_received.load(Ordering::Relaxed);
        now.saturating_sub(acked.min(received))
    }
}

/// `GET /v1/regions`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RegionsStatus {
    pub region: String,
    pub exchange_interval_ms: u64,
    pub stall_after_ms: u64,
    /// The share of a rule listing every region (one listing fewer
    /// regions has an equal share of those, unless `--region-ceiling` is
    /// set).
    pub ceiling_share: f64,
    /// Stalled with a majority of the peers (any, `--region-cut-off any`):
    /// the ceiling is in force for rules listing every region.
    pub cut_off: bool,
    pub peers: Vec<PeerStatus>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PeerStatus {
    pub region: String,
    pub addr: String,
    pub lag_ms: u64,
    pub last_acked_ms_ago: u64,
    pub last_received_ms_ago: u64,
    pub stalled: bool,
    /// USAGE messages this node sent that the peer answered.
    pub messages_acked: u64,
    pub keys_sent: u64,
    pub keys_received: u64,
    pub units_imported: u64,
}

#[cfg(test)]
mod tests;
