//! A connection's open MULTI: the commands it queued and the memory they
//! hold.
//!
//! Invariants:
//! - a transaction holds at most `--max-batch` commands and
//!   `--resp-max-multi-bytes` bytes ([`queued_size`]), and every byte it
//!   holds is taken from the shared `--max-connection-memory` budget
//!   first: a command that does not fit is refused (`-OOM`, as Redis
//!   refuses a command it has no memory for) and the transaction aborted,
//!   so EXEC answers `-EXECABORT`;
//! - an aborted transaction holds nothing (its commands are dropped and
//!   their memory given back at once: EXEC will not run them);
//! - the memory is given back when the transaction drops, whatever ends
//!   it (EXEC, DISCARD, RESET, the connection closing);
//! - queued commands are copied out of the read buffer into one exact
//!   allocation each, so a small queued command cannot keep a large read
//!   chunk alive outside the count.

use super::parse::Args;
use crate::server::budget::{Budget, Held};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// Why a command could not be queued. The OOM texts start as Redis's
/// (clients map the `OOM` code to their out-of-memory error), then say
/// which Tollgate bound refused and its figures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum QueueError {
    #[error("ERR a MULTI holds at most {max} commands (max-batch)")]
    TooMany { max: usize },
    #[error(
        "OOM command not allowed when used memory > 'maxmemory'. Tollgate: this MULTI would \
         hold {would} bytes of queued commands, at most {max} (resp-max-multi-bytes)"
    )]
    TooLarge { would: usize, max: usize },
    #[error(
        "OOM command not allowed when used memory > 'maxmemory'. Tollgate: the connections' \
         memory budget (max-connection-memory, {limit} bytes) has not {needed} bytes free"
    )]
    Budget { needed: usize, limit: usize },
}

/// Commands queued by MULTI.
#[derive(Debug)]
pub(super) struct Multi {
    queued: Vec<Args>,
    /// What `queued` holds of the connection memory budget.
    held: Held,
    /// A command could not be queued: EXEC answers EXECABORT.
    aborted: bool,
}

/// What one queued command costs beyond its arguments' bytes: the slot in
/// `queued` and a `Bytes` handle per argument.
const PER_COMMAND: usize = std::mem::size_of::<Args>();
const PER_ARG: usize = std::mem::size_of::<Bytes>();

/// The bytes a queued command is counted for.
pub(super) fn queued_size(args: &Args) -> usize {
    let data: usize = args.iter().map(Bytes::len).sum();
    PER_COMMAND + args.len() * PER_ARG + data
}

/// `args` in one allocation of exactly their bytes.
fn compact(args: &Args) -> Args {
    let mut one = BytesMut::with_capacity(args.iter().map(Bytes::len).sum());
    for a in args {
        one.extend_from_slice(a);
    }
    let mut one = one.freeze();
    args.iter().map(|a| one.split_to(a.len())).collect()
}

impl Multi {
    pub fn new(budget: Arc<Budget>) -> Self {
        Self {
            queued: Vec::new(),
            held: Held::new(budget),
            aborted: false,
        }
    }

    /// Queues `args` if the transaction has room for it (at most
    /// `max_commands` commands of `max_bytes` in all) and the budget has
    /// its bytes; otherwise aborts the transaction and says why.
    pub fn queue(
        &mut self,
        args: &Args,
        max_commands: usize,
        max_bytes: usize,
    ) -> Result<(), QueueError> {
        if self.aborted {
            // EXEC will answer EXECABORT whatever is queued: keep nothing.
            return Ok(());
        }
        let refused = self.room_for(args, max_commands, max_bytes);
        if let Err(e) = refused {
            self.abort();
            return Err(e);
        }
        self.queued.push(compact(args));
        Ok(())
    }

    fn room_for(
        &mut self,
        args: &Args,
        max_commands: usize,
        max_bytes: usize,
    ) -> Result<(), QueueError> {
        if self.queued.len() >= max_commands {
            return Err(QueueError::TooMany { max: max_commands });
        }
        let size = queued_size(args);
        let would = self.held.bytes().saturating_add(size);
        if would > max_bytes {
            return Err(QueueError::TooLarge {
                would,
                max: max_bytes,
            });
        }
        if !self.held.grow(size) {
            return Err(QueueError::Budget {
                needed: size,
                limit: self.held.limit(),
            });
        }
        Ok(())
    }

    /// Marks the transaction failed and gives back what it holds.
    pub fn abort(&mut self) {
        self.aborted = true;
        self.queued = Vec::new();
        self.held.release();
    }

    /// Whether the queued commands hold any of the budget.
    pub fn holds_budget(&self) -> bool {
        self.held.bytes() > 0
    }

    /// The queued commands, or None when the transaction was aborted.
    pub fn commands(&self) -> Option<&[Args]> {
        (!self.aborted).then_some(&self.queued[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Registry;

    fn args(words: &[&[u8]]) -> Args {
        words.iter().map(|w| Bytes::copy_from_slice(w)).collect()
    }

    #[test]
    fn bytes_are_held_until_the_transaction_drops_and_refusals_abort() {
        let budget = Arc::new(Budget::register(1 << 20, &Registry::new()).unwrap());
        let cmd = args(&[b"PING", &[b'x'; 1000]]);
        let size = queued_size(&cmd);
        let mut m = Multi::new(budget.clone());
        m.queue(&cmd, 10, 3 * size).unwrap();
        m.queue(&cmd, 10, 3 * size).unwrap();
        assert_eq!(m.held.bytes(), 2 * size);
        assert_eq!(
            m.queue(&cmd, 2, 3 * size),
            Err(QueueError::TooMany { max: 2 })
        );
        assert_eq!(m.commands(), None);
        assert_eq!(m.held.bytes(), 0, "an aborted transaction holds nothing");

        let mut m = Multi::new(budget.clone());
        m.queue(&cmd, 10, 3 * size).unwrap();
        m.queue(&cmd, 10, 3 * size).unwrap();
        m.queue(&cmd, 10, 3 * size).unwrap();
        assert!(matches!(
            m.queue(&cmd, 10, 3 * size),
            Err(QueueError::TooLarge { .. })
        ));
        let mut m = Multi::new(budget.clone());
        m.queue(&cmd, 10, 3 * size).unwrap();
        assert_eq!(m.commands().unwrap().len(), 1);
        assert_eq!(m.commands().unwrap()[0], cmd);
        drop(m);
        let mut hog = Held::new(budget.clone());
        assert!(hog.grow((1 << 20) - 10));
        let mut m = Multi::new(budget);
        assert!(matches!(
            m.queue(&cmd, 10, 1 << 20),
            Err(QueueError::Budget {
                limit: 1_048_576,
                ..
            })
        ));
    }
}
