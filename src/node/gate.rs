//! A request's slots, screened once per frame: which requests this node
//! serves here, which it redirects (MOVED), and which nobody may serve
//! right now (TryAgain). The answers follow PROTOCOL.md §14:
//!
//! 1. a key whose slot another shard owns (and that is not moving) makes
//!    the whole request MOVED, naming the first such key's slot (in
//!    request order) and its owner's primary;
//! 2. otherwise a key whose shard has no primary, or whose primary is this
//!    node past its lease deadline, makes the whole request ERROR TryAgain;
//! 3. otherwise the request is served, and a check (of CHECK, PEEK or
//!    REFUND) whose slot is moving gets status 2 TryAgain on its own
//!    (RESET and RELEASE: the whole request gets ERROR TryAgain).
//!
//! Nothing is evaluated before the screen passes, so a MOVED or TryAgain
//! request charged nothing. Outside a cluster the gate lets everything
//! through and costs nothing ([`Gate::All`]); in cluster mode it holds one
//! routing table for the whole frame, so every key of a frame is judged
//! against the same map.

use super::refusal::Refusal;
#[cfg(feature = "cluster")]
use tollgate_protocol::Pair;
use tollgate_protocol::Request;

/// Which of a request's keys this node serves, decided once per frame.
pub(crate) enum Gate<'a> {
    /// Every slot is served here (pair mode, a single node).
    All,
    /// Cluster mode: decided per slot from one routing table.
    #[cfg(feature = "cluster")]
    Slots(super::cluster::slot_gate::SlotGate<'a>),
    /// Holds the lifetime when cluster mode is not built in; never made.
    #[cfg(not(feature = "cluster"))]
    #[allow(dead_code)]
    Unbuilt(std::marker::PhantomData<&'a ()>),
}

impl Gate<'_> {
    /// Rules 1 and 2 (and 3 for RESET and RELEASE) for a whole request.
    pub fn screen(&self, request: &Request) -> Result<(), Refusal> {
        match self {
            #[cfg(feature = "cluster")]
            Self::Slots(gate) => match request {
                Request::Check(batch) | Request::Peek(batch) | Request::Refund(batch) => {
                    gate.screen(batch_keys(batch.iter()), false)
                }
                Request::Check2(tagged) => gate.screen(batch_keys(tagged.checks().iter()), false),
                Request::Reset(keys) => gate.screen(keys.iter().map(|k| &k[..]), true),
                Request::Release(leases) => gate.screen(leases.iter().map(|l| &l.key[..]), true),
                _ => Ok(()),
            },
            _ => {
                let _ = request;
                Ok(())
            }
        }
    }

    /// Rules 1 to 3 for a command or call of the drop-in front ends,
    /// served whole or not at all: it has no per-check status to answer
    /// TryAgain with, so a key whose slot is moving refuses all of it
    /// (TryAgain), as RESET does.
    pub fn screen_keys<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Result<(), Refusal> {
        match self {
            #[cfg(feature = "cluster")]
            Self::Slots(gate) => gate.screen(keys, true),
            _ => {
                let _ = keys;
                Ok(())
            }
        }
    }

    /// Rule 3: whether a check whose first key is `key` is answered
    /// TryAgain on its own (its slot is moving).
    pub fn moving(&self, key: &[u8]) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Self::Slots(gate) => gate.moving(key),
            _ => {
                let _ = key;
                false
            }
        }
    }

    /// Whether a state of `key` handed over by another node belongs here
    /// (its slot is this shard's, or is moving to it).
    pub fn receives(&self, key: &[u8]) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Self::Slots(gate) => gate.receives(key),
            _ => {
                let _ = key;
                true
            }
        }
    }
}

/// Every key of every check of a batch, in request order.
#[cfg(feature = "cluster")]
fn batch_keys<'b>(checks: impl Iterator<Item = &'b [Pair]>) -> impl Iterator<Item = &'b [u8]> {
    checks.flat_map(|pairs| pairs.iter().map(|p| &p.key[..]))
}
