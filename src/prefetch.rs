//! Cache-line prefetch hints: the crate's one place for the instruction
//! (an `unsafe` call only because it takes a raw pointer). The store uses
//! it to fetch a frame's keys before checking them and the records of a
//! drained change log before the replication sender reads them, the retry
//! memory to fetch the line a remembered answer will be written to while
//! the check it answers is evaluated.

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
