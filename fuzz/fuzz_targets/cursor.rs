#![no_main]
//! Any text as a list cursor.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        orders_api::invariants::check_cursor(text);
    }
});
