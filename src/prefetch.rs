//! Cache-line prefetch hints: the crate's one place for the instruction
//! (an `unsafe` call only because it takes a raw pointer). Its users: the
//! store fetches a frame's keys (where each key's probe starts, through
//! its tables' hints, and the lines of its stripe read under the lock)
//! before checking them, and the records of a change log taken by the
//! replication sender before it reads them; the regions' journal, where a
//! global check's usage will be recorded (through the same kind of hint),
//! and the entries ahead of the walk that seals it; the retry memory, the
//! index slots a CHECK2 key's lookup reads and the line its remembered
//! answer will be written to, while the check it answers is evaluated.

/// Bytes of a cache line on the CPUs the crate is tuned for (x86_64).
const LINE: usize = 64;

/// Asks the CPU to bring the cache line holding `addr` in, to be read;
/// elsewhere than x86_64, nothing.
#[inline]
#[allow(unsafe_code)]
pub(crate) fn line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint with no architectural effect: it loads
    // nothing the program sees and does not fault on any address, mapped or
    // not (Intel SDM vol. 2, PREFETCHh; AMD APM vol. 3), so a stale address
    // is harmless. `_mm_prefetch` is `unsafe` only for taking a raw pointer.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Asks the CPU to bring the cache line holding `addr` in, to be written
/// (PREFETCHW where the CPU has it, else a plain prefetch); elsewhere than
/// x86_64, nothing.
#[inline]
#[allow(unsafe_code)]
pub(crate) fn line_for_write(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `line`: a hint that neither faults nor changes what
    // the program sees.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        _mm_prefetch::<_MM_HINT_ET0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Asks for every cache line of the `len` bytes from `addr`, to be read
/// (none when `len` is 0).
#[inline]
pub(crate) fn range(addr: usize, len: usize) {
    each_line(addr, len, line);
}

/// Asks for every cache line of the `len` bytes from `addr`, to be
/// written (none when `len` is 0).
#[inline]
pub(crate) fn range_for_write(addr: usize, len: usize) {
    each_line(addr, len, line_for_write);
}

/// Calls `fetch` with the start of each line the `len` bytes from `addr`
/// touch. Wrapping: an address is only a hint, never dereferenced.
#[inline]
fn each_line(addr: usize, len: usize, fetch: fn(usize)) {
    if len == 0 {
        return;
    }
    let last = addr.wrapping_add(len - 1) & !(LINE - 1);
    let mut at = addr & !(LINE - 1);
    loop {
        fetch(at);
        if at == last {
            break;
        }
        at = at.wrapping_add(LINE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        static FETCHED: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }

    fn record(at: usize) {
        FETCHED.with(|f| f.borrow_mut().push(at));
    }

    fn lines(addr: usize, len: usize) -> Vec<usize> {
        FETCHED.with(|f| f.borrow_mut().clear());
        each_line(addr, len, record);
        FETCHED.with(|f| f.borrow().clone())
    }

    #[test]
    fn a_range_fetches_each_line_it_touches_once() {
        assert_eq!(lines(0x1000, 0), Vec::<usize>::new());
        assert_eq!(lines(0x1000, 1), [0x1000]);
        assert_eq!(lines(0x1000, 64), [0x1000]);
        assert_eq!(lines(0x1000, 65), [0x1000, 0x1040]);
        // Straddling: 8 bytes across a line boundary.
        assert_eq!(lines(0x103c, 8), [0x1000, 0x1040]);
        assert_eq!(
            lines(0x1008, 32 * 64),
            (0..33).map(|i| 0x1000 + i * 64).collect::<Vec<_>>()
        );
        // Wrapping addresses are hints only: no overflow, no endless loop.
        assert_eq!(lines(usize::MAX - 10, 5), [usize::MAX & !63]);
    }
}
