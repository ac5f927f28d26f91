//! Feeds arbitrary bytes to `decode_request` as a stream of frames and checks
//! the codec's invariants (progress, canonical re-encoding, limits) on every
//! step; see `tollgate_fuzz::check_decode_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_fuzz::{check_decode_request, FUZZ_LIMITS};

fuzz_target!(|data: &[u8]| {
    check_decode_request(data, &FUZZ_LIMITS);
});
