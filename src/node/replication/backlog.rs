//! The primary's backlog: the most recent stream frames, bounded in bytes,
//! so a standby that reconnects resumes instead of syncing everything again;
//! also the window of frames the attached standby has not acknowledged.
//!
//! Invariant: frames are held in offset order with consecutive offsets, and
//! never more than `cap` bytes of them.

use bytes::Bytes;
use std::collections::VecDeque;

/// Recent frames, for standbys that reconnect; also the window of frames
/// the attached standby has not acknowledged yet.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// (offset, frame, bytes pushed up to and including this frame).
    frames: VecDeque<(u64, Bytes, u64)>,
    bytes: usize,
    cap: usize,
    /// Bytes pushed since the backlog was created or cleared.
    pushed: u64,
}

impl Backlog {
    pub fn push(&mut self, offset: u64, frame: Bytes) {
        self.bytes += frame.len();
        self.pushed += frame.len() as u64;
        self.frames.push_back((offset, frame, self.pushed));
        while self.bytes > self.cap {
            let Some((_, old, _)) = self.frames.pop_front() else {
                break;
            };
            self.bytes -= old.len();
        }
    }

    /// The first offset still held (`last + 1` when empty).
    pub fn first(&self, last: u64) -> u64 {
        self.frames.front().map_or(last + 1, |(o, _, _)| *o)
    }

    /// Bytes of the frames after `offset` (a standby's acknowledged
    /// position); `None` when frames after it are no longer held.
    pub fn bytes_after(&self, offset: u64, last: u64) -> Option<u64> {
        if offset >= last {
            return Some(0);
        }
        let first = self.frames.front()?.0;
        if offset + 1 < first {
            return None;
        }
        // Offsets are consecutive: the acknowledged frame is at a known
        // index (or just before the front).
        let upto = match (offset + 1 - first) as usize {
            0 => self.pushed - self.bytes as u64,
            i => self.frames.get(i - 1)?.2,
        };
        Some(self.pushed - upto)
    }

    pub fn clear(&mut self) {
        self.frames.clear();
        self.bytes = 0;
        self.pushed = 0;
    }

    pub fn with_cap(cap: usize) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The most bytes held.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The frames after `offset`, oldest first.
    pub fn after(&self, offset: u64) -> impl Iterator<Item = &Bytes> {
        self.frames
            .iter()
            .filter(move |(o, _, _)| *o > offset)
            .map(|(_, f, _)| f)
    }
}
