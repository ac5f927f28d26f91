//! A RESP connection's read buffer: its own [`READ_BUFFER`] bytes, and
//! beyond them, for a command longer than that still arriving, memory
//! taken from the shared `--max-connection-memory` budget first (as the
//! protocol port's frames take it, `server/budget.rs`).
//!
//! A RESP command's size is not announced up front (an array of bulk
//! strings arrives piece by piece), so the buffer grows as the unfinished
//! command does: each growth takes its bytes from the budget. When the
//! budget has none, a connection that holds none waits, reading nothing
//! (TCP holds the client back), until memory is given back or
//! `--frame-timeout` ends the command; one that holds some is answered an
//! error and closed (`mod.rs`), so no connection waits while holding
//! budget. So however many clients send half of a command of
//! `--resp-max-args` x `max(--max-key-len, 512)` bytes and stop, the
//! process holds at most `--max-connections` x 16 KiB plus the budget.
//!
//! Invariants:
//! - the buffer's capacity beyond [`READ_BUFFER`] is exactly what it holds
//!   of the budget (it is allocated exactly, never by `reserve`'s own
//!   doubling);
//! - once what is buffered fits the own bytes again, the large
//!   allocation is dropped and its budget given back.

use crate::server::budget::{Budget, Held};
use bytes::BytesMut;
use std::sync::Arc;

/// Read buffer every connection owns, outside the budget.
pub(super) const READ_BUFFER: usize = 16 * 1024;
/// Spare room below which the buffer is made room in before reading.
const MIN_SPARE: usize = 1024;

pub(super) struct CommandBuffer {
    pub buf: BytesMut,
    /// What `buf`'s capacity beyond [`READ_BUFFER`] holds of the budget.
    held: Held,
}

impl CommandBuffer {
    pub fn new(budget: Arc<Budget>) -> Self {
        Self {
            buf: BytesMut::with_capacity(READ_BUFFER),
            held: Held::new(budget),
        }
    }

    /// Makes room for the next read (call after the complete commands are
    /// taken). Err: the budget lacks this many bytes for the unfinished
    /// command to grow; nothing was allocated.
    pub fn room_to_read(&mut self) -> Result<(), usize> {
        let len = self.buf.len();
        if self.held.bytes() > 0 && len + MIN_SPARE <= READ_BUFFER {
            // Back to small commands: a fresh own buffer, the large one
            // and its budget released.
            self.held.release();
            self.reallocate(READ_BUFFER);
            return Ok(());
        }
        if self.buf.capacity() - len >= MIN_SPARE {
            return Ok(());
        }
        if self.held.bytes() == 0 && len + MIN_SPARE <= READ_BUFFER {
            // Within the own bytes: reuse the front of the allocation
            // (what was parsed) or take a fresh one of the same size.
            if !self.buf.try_reclaim(READ_BUFFER - len) {
                self.reallocate(READ_BUFFER);
            }
            return Ok(());
        }
        // An unfinished command longer than the own bytes: grow
        // geometrically (a long command is copied a few times, not once
        // per read), each step's bytes taken from the budget first.
        let capacity = (len + READ_BUFFER).max(2 * len);
        let beyond = capacity - READ_BUFFER;
        let more = beyond.saturating_sub(self.held.bytes());
        if !self.held.grow(more) {
            return Err(more);
        }
        self.held.shrink_to(beyond);
        self.reallocate(capacity);
        Ok(())
    }

    /// Whether the buffer holds any of the budget.
    pub fn holds_budget(&self) -> bool {
        self.held.bytes() > 0
    }

    /// The budget's limit (`--max-connection-memory`), in bytes.
    pub fn budget_limit(&self) -> usize {
        self.held.limit()
    }

    /// Drops what is buffered and any memory beyond the own bytes.
    pub fn clear(&mut self) {
        self.buf.clear();
        if self.held.bytes() > 0 {
            self.held.release();
            self.reallocate(READ_BUFFER);
        }
    }

    /// A new allocation of exactly `capacity` bytes holding what is
    /// buffered.
    fn reallocate(&mut self, capacity: usize) {
        let mut fresh = BytesMut::with_capacity(capacity.max(self.buf.len()));
        fresh.extend_from_slice(&self.buf);
        self.buf = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use prometheus::Registry;

    #[test]
    fn a_long_command_takes_the_budget_and_gives_it_back() {
        let budget = Arc::new(Budget::register(256 * 1024, &Registry::new()).unwrap());
        let mut b = CommandBuffer::new(budget.clone());
        let mut other = CommandBuffer::new(budget.clone());
        // Small commands never touch the budget.
        b.buf.put_bytes(b'x', READ_BUFFER - 2000);
        b.room_to_read().unwrap();
        assert_eq!(b.held.bytes(), 0);
        // Growing past the own bytes: the capacity beyond them is held.
        b.buf.put_bytes(b'x', 1900);
        b.room_to_read().unwrap();
        assert_eq!(b.buf.capacity() - READ_BUFFER, b.held.bytes());
        assert!(b.held.bytes() > 0);
        while b.room_to_read().is_ok() && b.buf.len() < 200 * 1024 {
            let room = b.buf.capacity() - b.buf.len();
            b.buf.put_bytes(b'x', room);
        }
        // The budget (256 KiB) runs out: refused, nothing allocated.
        let before = b.buf.capacity();
        let lacking = b.room_to_read().unwrap_err();
        assert!(lacking > 0);
        assert_eq!(b.buf.capacity(), before);
        assert!(other.room_to_read().is_ok(), "small buffers need no budget");
        // The command is taken: back to the own bytes, budget given back.
        let _command = b.buf.split();
        b.room_to_read().unwrap();
        assert_eq!(b.held.bytes(), 0);
        assert_eq!(b.buf.capacity(), READ_BUFFER);
        other.buf.put_bytes(b'y', 100_000);
        other.room_to_read().unwrap();
        other.clear();
        assert_eq!(other.held.bytes(), 0);
    }
}
