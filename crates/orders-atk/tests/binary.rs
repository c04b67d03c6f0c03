//! The runner's own binary, as `cargo install --path crates/orders-atk`
//! installs it: the same command as `orders-api atk`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_orders-atk");

#[test]
fn orders_atk_offers_the_runner_s_flags() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--server",
        "--token",
        "--token-b",
        "--profile",
        "--base-path",
        "--id-field",
        "--strict",
        "--only",
        "--format",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn orders_atk_exits_non_zero_and_says_why_when_the_server_cannot_be_reached() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(BIN)
        .args(["--server", &format!("http://127.0.0.1:{port}")])
        .env_remove("ORDERS_API_TOKEN")
        .env_remove("ORDERS_API_TOKEN_B")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("orders-atk: cannot reach"), "{stderr}");
}
