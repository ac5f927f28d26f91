//! Memory for frames: each connection's read buffer, and the one budget
//! (`--max-connection-memory`) from which every buffer beyond its own
//! initial size is drawn.
//!
//! A connection owns [`INITIAL`] bytes of read buffer, enough for every
//! frame before HELLO (capped at `MAX_HELLO_FRAME`) and for the usual
//! pipelined requests. A frame announcing more must first take the
//! difference from the shared [`Budget`]; until it can, the connection
//! reads nothing more (its bytes wait in the kernel, and TCP holds the
//! client back). So the process holds at most
//! `max_connections * INITIAL + max_connection_memory` of partial frames,
//! however many clients send half a frame and stop. A RESP connection's
//! read buffer beyond its own 16 KiB (a long command still arriving) and
//! its queued MULTI draw from the same budget ([`Held`]), and so does
//! each Envoy RLS call in flight (`--envoy-max-message`, what tonic may
//! buffer of its body).
//!
//! Invariants:
//! - the budget's `used` is the sum of what every [`ReadBuffer`] and
//!   every [`Held`] holds;
//!   it never exceeds the limit (a take that would is refused);
//! - a buffer that took from the budget allocates exactly its frame, and
//!   gives back everything once only frames of the initial size remain;
//! - the decoder is called only on complete frames (or on a header it
//!   must refuse), so it never reserves memory on a peer's say-so.

use bytes::BytesMut;
use prometheus::{IntGauge, Registry};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;
use tollgate_protocol::FRAME_HEADER_LEN;

/// Read buffer every connection owns, outside the budget.
pub(crate) const INITIAL: usize = 16 * 1024;
/// Spare room below which a read buffer is made room in before reading.
const MIN_SPARE: usize = 1024;

/// The shared budget for read buffers beyond [`INITIAL`].
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
    /// Woken whenever memory is given back.
    released: Notify,
    gauge: IntGauge,
}

impl Budget {
    /// A budget of `limit` bytes, its use exported as
    /// `tollgate_connection_memory_bytes` (and the limit beside it).
    pub fn register(limit: usize, registry: &Registry) -> prometheus::Result<Self> {
        let gauge = IntGauge::new(
            "tollgate_connection_memory_bytes",
            "Bytes of connection read buffers beyond their initial 16 KiB, \
             of queued RESP transactions and of Envoy RLS calls in flight, \
             drawn from --max-connection-memory.",
        )?;
        let limit_gauge = IntGauge::new(
            "tollgate_connection_memory_limit_bytes",
            "The --max-connection-memory budget.",
        )?;
        limit_gauge.set(i64::try_from(limit).unwrap_or(i64::MAX));
        registry.register(Box::new(gauge.clone()))?;
        registry.register(Box::new(limit_gauge))?;
        Ok(Self {
            limit,
            used: AtomicUsize::new(0),
            released: Notify::new(),
            gauge,
        })
    }

    /// Takes `n` bytes if they are free.
    fn try_take(&self, n: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&after| after <= self.limit)
            })
            .is_ok();
        if taken {
            self.gauge.add(n as i64);
        }
        taken
    }

    fn give_back(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.used.fetch_sub(n, Ordering::AcqRel);
        self.gauge.sub(n as i64);
        self.released.notify_waiters();
    }

    /// Bytes taken now.
    #[cfg_attr(not(any(test, feature = "envoy")), allow(dead_code))]
    fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Bytes of the budget held for something other than a read buffer (a
/// RESP transaction's queued commands); given back when it drops, so a
/// holder ended any way (EXEC, DISCARD, the connection closing) returns
/// them.
pub(crate) struct Held {
    budget: Arc<Budget>,
    bytes: usize,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("bytes", &self.bytes).finish()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(std::mem::take(&mut self.bytes));
    }
}

impl Held {
    /// Holds nothing yet.
    pub fn new(budget: Arc<Budget>) -> Self {
        Self { budget, bytes: 0 }
    }

    /// Takes `n` more bytes if the budget has them free; false (nothing
    /// taken) when it has not.
    pub fn grow(&mut self, n: usize) -> bool {
        let taken = self.budget.try_take(n);
        if taken {
            self.bytes += n;
        }
        taken
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Gives back what is held beyond `n` bytes.
    pub fn shrink_to(&mut self, n: usize) {
        if self.bytes > n {
            self.budget.give_back(self.bytes - n);
            self.bytes = n;
        }
    }

    /// Gives back everything held.
    pub fn release(&mut self) {
        self.budget.give_back(std::mem::take(&mut self.bytes));
    }

    /// The budget's limit, in bytes.
    pub fn limit(&self) -> usize {
        self.budget.limit
    }

    /// Bytes of the budget in use now, by every holder (the Envoy port
    /// names it when it refuses a call).
    #[cfg_attr(not(feature = "envoy"), allow(dead_code))]
    pub fn used(&self) -> usize {
        self.budget.used()
    }
}

/// One connection's read buffer; what it holds of the budget is given
/// back when it drops.
pub(crate) struct ReadBuffer {
    pub buf: BytesMut,
    budget: Arc<Budget>,
    /// Bytes of the budget this buffer holds.
    held: usize,
}

impl Drop for ReadBuffer {
    fn drop(&mut self) {
        self.budget.give_back(std::mem::take(&mut self.held));
    }
}

impl ReadBuffer {
    pub fn new(budget: Arc<Budget>) -> Self {
        Self {
            buf: BytesMut::with_capacity(INITIAL),
            budget,
            held: 0,
        }
    }

    /// Bytes of the frame at the front (header included), 0 without a
    /// header yet.
    pub fn front_frame(&self) -> usize {
        announced(&self.buf).map_or(0, frame_size)
    }

    /// Whether the front of the buffer is a whole frame, or a header the
    /// decoder must refuse (shorter than `min` or longer than `max`): what
    /// may be handed to the decoder without it reserving anything.
    pub fn decodable(&self, min: u32, max: u32) -> bool {
        match announced(&self.buf) {
            None => false,
            Some(len) if len < min || len > max => true,
            Some(len) => self.buf.len() >= frame_size(len),
        }
    }

    /// Makes room for the next read (call after the complete frames are
    /// taken): the initial buffer for small frames, exactly the frame for
    /// a larger one while the budget allows, which is then taken from it.
    /// Err: the frame at the front needs this many more bytes of the
    /// budget; nothing was allocated.
    pub fn room_to_read(&mut self) -> Result<(), usize> {
        let want = self.front_frame();
        let len = self.buf.len();
        if want <= INITIAL {
            if self.held > 0 {
                // Back to small frames: a fresh initial buffer, the large
                // one and its budget released.
                self.budget.give_back(std::mem::take(&mut self.held));
                self.reallocate(INITIAL);
                return Ok(());
            }
            // Room for the rest of the frame, and for more behind it when
            // the initial buffer has it (pipelined requests).
            let spare = want
                .saturating_sub(len)
                .max(MIN_SPARE)
                .min(INITIAL.saturating_sub(len))
                .max(1);
            if self.buf.capacity() - len < spare && !self.buf.try_reclaim(spare) {
                self.reallocate(INITIAL);
            }
            return Ok(());
        }
        let needed = want - INITIAL;
        if self.buf.capacity() >= want && self.held >= needed {
            return Ok(());
        }
        if needed > self.held {
            if !self.budget.try_take(needed - self.held) {
                return Err(needed - self.held);
            }
        } else {
            self.budget.give_back(self.held - needed);
        }
        self.held = needed;
        self.reallocate(want);
        Ok(())
    }

    /// Waits until the budget has `n` bytes free or `deadline` passes
    /// (false); does not take them ([`room_to_read`](Self::room_to_read) will).
    pub async fn wait_for(budget: &Budget, n: usize, deadline: tokio::time::Instant) -> bool {
        loop {
            let released = budget.released.notified();
            tokio::pin!(released);
            // Registered before the check, so a release in between wakes it.
            released.as_mut().enable();
            if budget
                .limit
                .saturating_sub(budget.used.load(Ordering::Acquire))
                >= n
            {
                return true;
            }
            tokio::select! {
                () = released => {}
                () = tokio::time::sleep_until(deadline) => return false,
            }
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

/// The body length the header at the front of `buf` announces.
fn announced(buf: &[u8]) -> Option<u32> {
    let header: [u8; FRAME_HEADER_LEN] = buf.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
    Some(u32::from_be_bytes(header))
}

/// Header plus body.
fn frame_size(len: u32) -> usize {
    FRAME_HEADER_LEN.saturating_add(len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn budget(limit: usize) -> Arc<Budget> {
        Arc::new(Budget::register(limit, &Registry::new()).unwrap())
    }

    fn header(buf: &mut ReadBuffer, len: u32) {
        buf.buf.put_u32(len);
        buf.buf.put_u8(0x03);
    }

    #[test]
    fn small_frames_stay_in_the_initial_buffer() {
        let b = budget(1 << 20);
        let mut r = ReadBuffer::new(b.clone());
        header(&mut r, 100);
        assert!(!r.decodable(5, 1 << 20), "incomplete");
        assert_eq!(r.room_to_read(), Ok(()));
        assert_eq!(b.used(), 0);
        assert!(r.buf.capacity() >= INITIAL);
        r.buf.put_bytes(0, 99);
        assert!(r.decodable(5, 1 << 20));
    }

    #[test]
    fn a_large_frame_takes_exactly_its_size_and_gives_it_back() {
        let b = budget(1 << 20);
        let mut r = ReadBuffer::new(b.clone());
        let len = 100_000;
        header(&mut r, len);
        assert_eq!(r.room_to_read(), Ok(()));
        let frame = frame_size(len);
        assert_eq!(r.buf.capacity(), frame);
        assert_eq!(b.used(), frame - INITIAL);
        // The frame arrives and is taken; what follows is small again.
        r.buf.put_bytes(0, frame - 5);
        let _taken = r.buf.split_to(frame);
        assert_eq!(r.room_to_read(), Ok(()));
        assert_eq!(b.used(), 0);
        assert_eq!(r.buf.capacity(), INITIAL);
    }

    #[test]
    fn without_budget_a_large_frame_is_short_and_reads_nothing_more() {
        let b = budget(64 * 1024);
        let mut a = ReadBuffer::new(b.clone());
        header(&mut a, 60_000);
        assert_eq!(a.room_to_read(), Ok(()));
        let mut c = ReadBuffer::new(b.clone());
        header(&mut c, 60_000);
        assert_eq!(c.room_to_read(), Err(frame_size(60_000) - INITIAL));
        assert_eq!(c.buf.capacity(), INITIAL, "nothing allocated");
        drop(a);
        assert_eq!(b.used(), 0);
        assert_eq!(c.room_to_read(), Ok(()));
    }

    #[test]
    fn held_bytes_are_refused_past_the_limit_and_given_back_on_drop() {
        let b = budget(64 * 1024);
        let mut held = Held::new(b.clone());
        assert!(held.grow(40_000));
        assert!(!held.grow(40_000), "past the limit");
        assert_eq!(held.bytes(), 40_000);
        assert_eq!(b.used(), 40_000);
        drop(held);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn a_waiting_frame_wakes_when_memory_is_given_back() {
        let b = budget(64 * 1024);
        let mut a = ReadBuffer::new(b.clone());
        header(&mut a, 60_000);
        assert_eq!(a.room_to_read(), Ok(()));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { ReadBuffer::wait_for(&b, 50_000, deadline).await })
        };
        tokio::task::yield_now().await;
        drop(a);
        assert!(waiter.await.unwrap());
        let past = tokio::time::Instant::now();
        assert!(!ReadBuffer::wait_for(&b, 1 << 20, past).await);
    }
}
