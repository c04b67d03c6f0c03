#![no_main]
//! Any bytes as a JSON body: the fingerprint's canonical JSON.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    idempotency_ledger::invariants::check_fingerprint(data);
});
