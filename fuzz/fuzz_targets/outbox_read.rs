#![no_main]
//! Any text as what the client reads back: an answer's body (the order it
//! names) and an outbox row (one field per line).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    orders_client::invariants::check_outbox_read(data);
});
