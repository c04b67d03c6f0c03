#![no_main]
//! Any bytes as a `POST /v1/orders` body.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    orders_api::invariants::check_order_body(data, true);
});
