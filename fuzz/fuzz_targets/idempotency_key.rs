#![no_main]
//! Any bytes as an `Idempotency-Key` header value (token and RFC 8941 forms).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    idempotency_ledger::invariants::check_key(data);
});
