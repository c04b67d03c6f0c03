//! The attack definitions judge behaviour: put the real server behind a
//! front that breaks one rule (the way a careless gateway or a naive
//! implementation would) and the attack that guards that rule says so, with
//! evidence that shows the break — EXPOSED where the break lets the attack
//! achieve something, a deviation where it only changes an answer.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use orders_api::db::Backend;
use orders_atk::wire::Message;
use orders_atk::{self as atk, Verdict};
use serde_json::Value;

use crate::atk::target_of;
use crate::helpers::*;
use crate::net::Front;

/// The one rule a [`BrokenFront`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    /// Invents a key when the client sent none (or a blank one).
    FillsMissingKeys,
    /// Answers a `409` with the key's first answer as a `200`.
    ConflictAsReplay,
    /// Sends every request with one and the same key.
    OneKeyForAll,
    /// Sends every request with a fresh key: duplicates get through.
    FreshKeyPerRequest,
    /// Answers `201` where the server said `422`.
    InvalidAsCreated,
    /// Adds `Access-Control-Allow-Origin: *` to every answer.
    AnyOriginAllowed,
    /// Coerces any non-integer `quantity` to `1` before the server sees it.
    CoercesQuantity,
    /// Drops `Location` from replays.
    DropsReplayLocation,
}

/// A thread-per-connection HTTP front of the test server that breaks one rule.
pub struct BrokenFront {
    pub address: String,
    _front: Front,
}

/// What the front's connections share.
struct Shared {
    upstream: String,
    breakage: Breakage,
    /// Tells this front's invented keys from another front's.
    tag: String,
    counter: AtomicUsize,
    /// Breakage::ConflictAsReplay: each key's first `201` body.
    first_answers: Mutex<HashMap<String, String>>,
}

impl BrokenFront {
    pub fn new(upstream: &str, breakage: Breakage) -> Self {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let shared = Arc::new(Shared {
            upstream: upstream.trim_start_matches("http://").to_owned(),
            breakage,
            tag,
            counter: AtomicUsize::new(0),
            first_answers: Mutex::new(HashMap::new()),
        });
        let front = Front::start(move |client, _| serve(client, &shared));
        Self {
            address: front.address(),
            _front: front,
        }
    }
}

/// `message` as it goes on the wire, with `Connection: close`: one
/// request per connection.
fn closing(mut message: Message) -> Vec<u8> {
    message.set_header("Connection", "close");
    message.to_bytes()
}

/// One request per connection: read it, break it, forward it, break the
/// answer, send it back, close.
fn serve(client: TcpStream, shared: &Shared) {
    let mut reader = BufReader::new(client.try_clone().expect("clone"));
    let Some(mut request) = Message::read(&mut reader) else {
        return;
    };
    let sent_key = request.header("Idempotency-Key").map(str::to_owned);
    let n = shared.counter.fetch_add(1, Ordering::SeqCst);
    match shared.breakage {
        Breakage::FillsMissingKeys if sent_key.as_deref().is_none_or(|k| k.trim().is_empty()) => {
            request.set_header(
                "Idempotency-Key",
                &format!("front-invented-{}-{n}", shared.tag),
            );
        }
        Breakage::OneKeyForAll if sent_key.is_some() => {
            request.set_header("Idempotency-Key", &format!("front-one-key-{}", shared.tag));
        }
        Breakage::FreshKeyPerRequest if sent_key.is_some() => {
            let key = format!("{}-front-{n}", sent_key.as_deref().unwrap_or_default());
            request.set_header("Idempotency-Key", &key);
        }
        Breakage::CoercesQuantity => {
            if let Ok(mut body) = serde_json::from_slice::<Value>(&request.body)
                && body.get("quantity").is_some_and(|q| q.as_i64().is_none())
            {
                body["quantity"] = Value::from(1);
                request.body = serde_json::to_vec(&body).expect("body");
            }
        }
        _ => {}
    }

    let mut upstream = TcpStream::connect(&shared.upstream).expect("connect to the server");
    upstream.write_all(&closing(request)).expect("forward");
    let mut answer =
        Message::read(&mut BufReader::new(&mut upstream)).expect("the server answered");

    match shared.breakage {
        Breakage::ConflictAsReplay => {
            let mut first = shared.first_answers.lock().expect("lock");
            if let Some(key) = &sent_key {
                match answer.status() {
                    201 => {
                        first.insert(key.clone(), String::from_utf8_lossy(&answer.body).into());
                    }
                    409 if first.contains_key(key) => {
                        answer.set_status(200);
                        answer.body = first[key].clone().into_bytes();
                        answer.set_header("Content-Type", "application/json");
                        answer.set_header("Idempotent-Replayed", "true");
                    }
                    _ => {}
                }
            }
        }
        Breakage::InvalidAsCreated if answer.status() == 422 => answer.set_status(201),
        Breakage::AnyOriginAllowed => answer.set_header("Access-Control-Allow-Origin", "*"),
        Breakage::DropsReplayLocation if answer.header("Idempotent-Replayed").is_some() => {
            answer.remove_header("Location");
        }
        _ => {}
    }
    let mut client = client;
    let _ = client.write_all(&closing(answer));
    let _ = client.flush();
}

/// What a check must say about a front that breaks one rule.
#[derive(Debug, Clone, Copy)]
enum Judged {
    /// EXPOSED, and one of its exposures says this.
    Exposed(&'static str),
    /// BLOCKED (the break achieved nothing), with a deviation that says this.
    Deviation(&'static str),
}

/// Each rule broken, the attack that must catch it, and what it must say.
const CASES: &[(Breakage, &str, Judged)] = &[
    (
        Breakage::FillsMissingKeys,
        "ATK-01",
        Judged::Exposed("a POST without Idempotency-Key created 1 order(s): "),
    ),
    (
        Breakage::FillsMissingKeys,
        "ATK-02",
        Judged::Exposed("a blank key created 5 order(s): "),
    ),
    (
        Breakage::ConflictAsReplay,
        "ATK-03",
        Judged::Exposed("was answered 200 with the first order"),
    ),
    (
        Breakage::OneKeyForAll,
        "ATK-04",
        Judged::Exposed("the second key was answered 200 with the first key's order"),
    ),
    (
        Breakage::FreshKeyPerRequest,
        "ATK-05",
        Judged::Exposed("8 concurrent requests with one key created "),
    ),
    // A 201 that names no order created nothing: judged by state, it is a
    // deviation, not an exposure.
    (
        Breakage::InvalidAsCreated,
        "ATK-06",
        Judged::Deviation("201 where the contract says 422: quantity -1, quantity -1000000"),
    ),
    (
        Breakage::InvalidAsCreated,
        "ATK-07",
        Judged::Deviation("201 where the contract says 422: quantity 0"),
    ),
    (
        Breakage::InvalidAsCreated,
        "ATK-08",
        Judged::Deviation("201 where the contract says 422: no item, no quantity, no price, {}"),
    ),
    (
        Breakage::AnyOriginAllowed,
        "ATK-09",
        Judged::Exposed("`Access-Control-Allow-Origin: *`"),
    ),
    (
        Breakage::InvalidAsCreated,
        "ATK-10",
        Judged::Deviation("201 where the contract says 422: price -0.01, price -9.99"),
    ),
    (
        Breakage::CoercesQuantity,
        "ATK-11",
        // Each body under a key of its own: every coerced one is an order,
        // laid to the body that made it.
        Judged::Exposed("quantity \"1\" created order "),
    ),
    (
        Breakage::FreshKeyPerRequest,
        "ATK-12",
        Judged::Exposed("6 orders for 3 key(s) with SQL in them, each sent twice"),
    ),
    (
        Breakage::OneKeyForAll,
        "EXT-03",
        Judged::Exposed(
            "keys have no bound: the target accepted and replayed 8 KiB and 64 KiB keys",
        ),
    ),
    (
        Breakage::DropsReplayLocation,
        "EXT-04",
        Judged::Deviation("a retry's Location is (none)"),
    ),
];

#[test]
fn each_attack_is_judged_with_its_evidence_against_a_target_that_breaks_its_rule() {
    let app = TestApp::spawn(Backend::Sqlite);
    for &(breakage, id, judged) in CASES {
        let front = BrokenFront::new(&app.address, breakage);
        let mut target = target_of(&app);
        target.server = front.address.clone();
        target.concurrency = 8;

        let report = atk::find(id).expect("defined").run(&target);

        let case = format!("{id} behind a front that {breakage:?}");
        let evidence = report.evidence();
        eprintln!("--- {case}\n{evidence}");
        let said = match (judged, &report.verdict) {
            (Judged::Exposed(says), Verdict::Exposed { exposed }) => {
                exposed.iter().find(|e| e.contains(says)).cloned()
            }
            (Judged::Deviation(says), Verdict::Blocked) => {
                report.deviations.iter().find(|d| d.contains(says)).cloned()
            }
            _ => None,
        };
        let Some(said) = said else {
            panic!(
                "{case} should be {judged:?}, is {}:\n{evidence}",
                report.verdict.label()
            );
        };
        assert!(
            !report.exchanges.is_empty() && evidence.contains(&said),
            "{case}: no evidence:\n{evidence}"
        );
        if id == "ATK-05" {
            // The exposure names every order the duplicates created.
            let ids: Vec<&str> = said
                .rsplit(": ")
                .next()
                .unwrap_or_default()
                .split(", ")
                .collect();
            assert!(ids.len() >= 2, "{said}");
            for order in ids {
                assert!(
                    crate::expect::stored_order(&app, "alice", order).is_some(),
                    "{order} is not an order: {said}"
                );
            }
        }
    }
}

#[test]
fn each_attack_is_still_blocked_without_deviation_through_a_front_that_breaks_nothing_it_judges() {
    // The front itself (Connection: close, rewritten lengths) changes no verdict.
    let app = TestApp::spawn(Backend::Sqlite);
    let front = BrokenFront::new(&app.address, Breakage::DropsReplayLocation);
    let mut target = target_of(&app);
    target.server = front.address.clone();
    target.concurrency = 8;
    for id in ["ATK-01", "ATK-03", "ATK-05", "ATK-09", "ATK-11"] {
        let report = atk::find(id).expect("defined").run(&target);
        assert!(
            report.blocked() && report.deviations.is_empty(),
            "{id}:\n{}",
            report.evidence()
        );
    }
}
