#![no_main]
//! Any bytes as a request's `Content-Type`: the media type check.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    idempotency_ledger::invariants::check_media_type(data);
});
