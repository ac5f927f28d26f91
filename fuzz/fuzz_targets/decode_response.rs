//! Feeds arbitrary bytes to `decode_response` as a stream of frames and checks
//! the codec's invariants; see `tollgate_fuzz::check_decode_response`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_fuzz::{check_decode_response, FUZZ_MAX_RESPONSE_FRAME};

fuzz_target!(|data: &[u8]| {
    check_decode_response(data, FUZZ_MAX_RESPONSE_FRAME);
});
