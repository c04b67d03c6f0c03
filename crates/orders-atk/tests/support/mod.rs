//! Test targets: other implementations of the pattern. Each test binary
//! uses the one it needs.
#![allow(dead_code)]

pub mod front;
pub mod layered;
pub mod orders_double;
pub mod seed;
