#![no_main]
//! Any text as what the client reads from its command line: an order id, an
//! operation's target (`op:N` or an order id) and a number flag.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    orders_client::invariants::check_client_args(data);
});
