#![no_main]
//! Any text as the server's settings that could quietly break its
//! guarantee: `DATABASE_URL` (a SQLite URL must keep the database in a file
//! it locks), a `CORS_ALLOWED_ORIGINS` entry and `LOG_FORMAT`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        orders_api::invariants::check_settings(text);
    }
});
