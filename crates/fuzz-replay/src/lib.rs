//! Test support: replays a fuzz target's committed corpus (`fuzz/corpus/T`)
//! and its hand-written seeds (`fuzz/seeds/T`) through the target's
//! invariant, on the stable toolchain, so `cargo test` keeps every input a
//! fuzzer once found. Only tests depend on this crate.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

/// Runs `check` on every file of `target`'s corpus and seeds, and fails
/// naming the first input that breaks it (or when there is no corpus).
pub fn replay(target: &str, check: impl Fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut count = 0;
    for dir in [
        fuzz.join("corpus").join(target),
        fuzz.join("seeds").join(target),
    ] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&bytes)));
            assert!(outcome.is_ok(), "{} breaks its invariant", path.display());
            count += 1;
        }
    }
    assert!(count > 1, "no corpus for {target}");
}
