#![no_main]
//! Any text as a history (`atk history`), checked, and as a JSON value
//! canonicalised.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    orders_atk::invariants::check_history(data);
});
