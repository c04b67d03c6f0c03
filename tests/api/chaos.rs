//! `atk chaos` against this service (SPEC §6, History checking): the real
//! binary on a fresh database, killed with SIGKILL and started again on the
//! same database between rounds, while two users' clients create, update,
//! cancel and read through the runner's fault-injecting proxy: the history
//! is consistent. Behind a front that gives every request a fresh key, the
//! retries make duplicates, and the check names the key. Without a token,
//! the orders cannot be listed and nothing starts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orders_api::db::Backend;
use orders_atk::Format;
use orders_atk::chaos::{ChaosConfig, Restart, run_chaos};
use orders_atk::history::Rule;

use crate::atk_broken::{Breakage, BrokenFront};
use crate::both_backends;
use crate::helpers::*;
use crate::process::{ServerProcess, create_token, order_count, prepare};

/// How long the clients start operations; the server is restarted every
/// [`ROUND`] within it.
const DURATION: Duration = Duration::from_secs(8);
const ROUND: Duration = Duration::from_secs(3);

both_backends! {
    fn chaos_with_the_server_killed_and_restarted_between_rounds_finds_the_history_consistent(backend) {
        let db = TestDb::fresh(backend);
        let pool = prepare(&db.url);
        let alice = create_token(&pool, "alice");
        let bob = create_token(&pool, "bob");
        let server = Arc::new(Mutex::new(ServerProcess::start(&db.url, &[])));
        let address = server.lock().expect("server").address();

        let mut config = ChaosConfig::new(&address, Some(&alice));
        config.tokens.push(Some(bob));
        config.duration = DURATION;
        config.clients = 6;
        let restarted = Arc::clone(&server);
        let expected = address.clone();
        config.restart = Some((
            Restart::Hook(Box::new(move || {
                let mut server = restarted.lock().map_err(|e| e.to_string())?;
                // `kill -9`, then a start on the same database and port.
                server.restart(&[]);
                if server.address() == expected {
                    Ok(())
                } else {
                    Err(format!("the server came back on {}, not {expected}", server.address()))
                }
            })),
            ROUND,
        ));
        let report = run_chaos(config).expect("the run starts");

        let text = report.render(Format::Text);
        eprintln!("{text}");
        assert!(report.check.consistent(), "{text}");
        assert!(report.problems.is_empty(), "{text}");
        assert!(report.outcome().is_ok(), "{text}");
        // Every `ROUND` while the clients run: twice, or once when a start
        // takes long on a loaded machine.
        assert!(!report.restarts.is_empty(), "{text}");
        assert!(report.restarts.iter().all(|r| r.ok), "{:?}", report.restarts);
        assert!(report.acknowledged > 0, "{text}");
        for f in ["create", "update", "cancel", "read"] {
            assert!(report.operations.get(f).is_some_and(|c| c.ok > 0), "no ok {f}\n{text}");
        }
        // Some answers never came: each retried under its key, none doubled.
        assert!(report.operations["create"].info > 0, "{text}");
        // The closing lists are every order the database holds.
        assert_eq!(order_count(&pool) as usize, report.check.orders, "{text}");
        drop(server);
    }
}

#[test]
fn chaos_through_a_front_that_gives_every_retry_a_fresh_key_finds_a_key_with_two_orders() {
    let app = TestApp::spawn(Backend::Sqlite);
    let front = BrokenFront::new(&app.address, Breakage::FreshKeyPerRequest);

    let mut config = ChaosConfig::new(&front.address, Some(&app.token));
    config.duration = Duration::from_secs(3);
    config.clients = 3;
    let report = run_chaos(config).expect("the run starts");

    let text = report.render(Format::Text);
    let violation = report
        .check
        .of(Rule::OneOrderPerKey)
        .next()
        .unwrap_or_else(|| panic!("no key with two orders:\n{text}"));
    let key = violation.key.as_deref().expect("the key");
    assert!(
        key.starts_with(&format!("chaos-{}-", report.run_id)),
        "{key}"
    );
    assert!(
        violation.what.contains("one key made two orders"),
        "{}",
        violation.what
    );
    assert!(
        text.contains(&format!("INCONSISTENT  one-order-per-key  key \"{key}\"")),
        "{text}"
    );
    assert_eq!(report.outcome().unwrap_err().exit_code(), 1);
}

#[test]
fn chaos_without_a_token_cannot_list_the_orders_starts_nothing_and_says_why() {
    let app = TestApp::spawn(Backend::Sqlite);

    let refused = match run_chaos(ChaosConfig::new(&app.address, None)) {
        Ok(report) => panic!("it ran:\n{}", report.render(Format::Text)),
        Err(refused) => refused,
    };

    let said = refused.to_string();
    assert!(
        said.starts_with("the run cannot be judged: listing the orders of user-a"),
        "{said}"
    );
    assert!(said.contains(": 401 "), "{said}");
    assert_eq!(refused.exit_code(), 1);
    assert_eq!(app.order_count(), 0);
}

#[test]
fn orders_api_atk_history_exits_0_1_or_2_as_the_history_is_consistent_inconsistent_or_malformed() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/orders-atk/tests/histories");
    for (file, code, says) in [
        ("consistent.jsonl", 0, "consistent: 0 violation(s); "),
        (
            "two-orders-one-key.jsonl",
            1,
            "INCONSISTENT  one-order-per-key  key \"k-17\"",
        ),
        ("malformed-type.jsonl", 2, ""),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_orders-api"))
            .args(["atk", "history"])
            .arg(fixtures.join(file))
            .output()
            .expect("run orders-api atk history");
        let out = String::from_utf8_lossy(&output.stdout);
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{file}\n{out}\n{err}");
        assert!(out.contains(says), "{file}\n{out}");
        if code == 2 {
            assert!(
                err.starts_with("orders-api: ") && err.contains("line 5: "),
                "{err}"
            );
        }
    }
}
