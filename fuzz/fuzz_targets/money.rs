#![no_main]
//! A price literal: stored as exactly its value, or refused naming `price`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(literal) = std::str::from_utf8(data) {
        orders_api::invariants::check_price_literal(literal);
    }
});
