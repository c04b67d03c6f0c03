//! The attacks of SPEC §5 and the extras a client can judge over HTTP, one
//! definition each. A check judges what the target does (statuses, which
//! orders exist, what a replay carries), never how it is built, and leaves
//! its requests and answers as evidence.

use serde_json::Value;

use super::probe::{Call, Failure, Probe, Response, User, ensure};

/// What a check needs from the command line before it can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// `--token`: it sends authenticated requests as user A.
    Token,
    /// `--token` and `--token-b`: it compares two users.
    TwoUsers,
}

/// One attack: what it sends, what it expects, and the check that judges it.
pub struct Attack {
    pub id: &'static str,
    pub title: &'static str,
    pub sends: &'static str,
    pub expects: &'static str,
    pub needs: Needs,
    pub(crate) check: fn(&mut Probe<'_>) -> Result<(), Failure>,
}

impl std::fmt::Debug for Attack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.id, self.title)
    }
}

/// Every attack, in the order they run.
pub const ATTACKS: &[Attack] = &[
    Attack {
        id: "ATK-01",
        title: "POST without Idempotency-Key",
        sends: "a valid order, no Idempotency-Key header",
        expects: "400; no order created",
        needs: Needs::Token,
        check: atk_01,
    },
    Attack {
        id: "ATK-02",
        title: "empty or whitespace-only key",
        sends: "a valid order with the keys \"\", \" \", \"   \", \"\\t\", \" \\t \"",
        expects: "400 for each; no order created",
        needs: Needs::Token,
        check: atk_02,
    },
    Attack {
        id: "ATK-03",
        title: "replay a key with a changed body",
        sends: "an order (quantity 2, price 9.99), then the same key with quantity 99, price 0.01",
        expects: "201, then 409; the original order unchanged; no second order",
        needs: Needs::Token,
        check: atk_03,
    },
    Attack {
        id: "ATK-04",
        title: "two different keys",
        sends: "the same order twice, each with its own key",
        expects: "two 201s with two different orders (by design)",
        needs: Needs::Token,
        check: atk_04,
    },
    Attack {
        id: "ATK-05",
        title: "concurrent requests with one key",
        sends: "--concurrency identical POSTs with one key, released together (3 rounds)",
        expects: "one 201 and one order per round; every other answer a 200 replay of that order or a 409 in progress; no 5xx",
        needs: Needs::Token,
        check: atk_05,
    },
    Attack {
        id: "ATK-06",
        title: "negative quantity",
        sends: "quantity -1 and -1000000",
        expects: "422; no order created",
        needs: Needs::Token,
        check: atk_06,
    },
    Attack {
        id: "ATK-07",
        title: "zero quantity",
        sends: "quantity 0",
        expects: "422; no order created",
        needs: Needs::Token,
        check: atk_07,
    },
    Attack {
        id: "ATK-08",
        title: "missing required fields",
        sends: "an order without item, without quantity, without price, and {}",
        expects: "422 for each; no order created",
        needs: Needs::Token,
        check: atk_08,
    },
    Attack {
        id: "ATK-09",
        title: "cross-origin browser POST",
        sends: "form, multipart and text/plain POSTs from a foreign Origin, a CORS preflight, a JSON POST from that Origin",
        expects: "415 for non-JSON bodies and nothing created by them; no Access-Control-Allow-* for the foreign origin",
        needs: Needs::Token,
        check: atk_09,
    },
    Attack {
        id: "ATK-10",
        title: "negative price",
        sends: "price -0.01 and -9.99",
        expects: "422; no order created",
        needs: Needs::Token,
        check: atk_10,
    },
    Attack {
        id: "ATK-11",
        title: "quantity as a string, float or other non-integer",
        sends: "quantity \"1\", 1.5, 1.0, 1e2, true, null",
        expects: "422 for each; no order created",
        needs: Needs::Token,
        check: atk_11,
    },
    Attack {
        id: "ATK-12",
        title: "SQL injection in the key",
        sends: "keys such as '; DROP TABLE orders; -- , each sent twice",
        expects: "an opaque key: 201, then a 200 replay of the same order; one order per key; listing still works",
        needs: Needs::Token,
        check: atk_12,
    },
    Attack {
        id: "EXT-01",
        title: "another user's key (tenancy)",
        sends: "user A and user B each POST the same order with the same key",
        expects: "two unrelated keys: B gets its own 201 and its own order, not A's replay",
        needs: Needs::TwoUsers,
        check: ext_01,
    },
    Attack {
        id: "EXT-02",
        title: "another user's order (tenancy)",
        sends: "user B reads, changes and cancels user A's order, and a nonexistent one",
        expects: "404 exactly like a nonexistent order; A's order unchanged and absent from B's list",
        needs: Needs::TwoUsers,
        check: ext_02,
    },
    Attack {
        id: "EXT-03",
        title: "key over 255 characters",
        sends: "a key of 256 characters, then one of exactly 255",
        expects: "400 and nothing created for 256; 201 for 255",
        needs: Needs::Token,
        check: ext_03,
    },
    Attack {
        id: "EXT-04",
        title: "replay header preservation",
        sends: "an order, then the same request twice",
        expects: "each retry: 200, Idempotent-Replayed: true, the same body, Location and Content-Type",
        needs: Needs::Token,
        check: ext_04,
    },
];

/// Fails unless `response` has status `want`.
fn expect_status(response: &Response, want: u16, what: &str) -> Result<(), Failure> {
    ensure(response.status == want, || {
        format!(
            "{what}: expected {want}, got {}",
            describe_unexpected(response)
        )
    })
}

/// The status and, for a created order, the fact that it was created.
fn describe_unexpected(response: &Response) -> String {
    match response.id() {
        Some(id) if (200..300).contains(&response.status) => {
            format!("{} with order {id}", response.status)
        }
        _ => response.brief(),
    }
}

/// The `id` of an answer that should carry an order.
fn id_of(response: &Response, what: &str) -> Result<String, Failure> {
    response
        .id()
        .ok_or_else(|| Failure(format!("{what}: no order id in {}", response.brief())))
}

/// `POST`s `body` as user A with `key`, expects a `201`, returns it and the
/// order's id.
fn create(
    p: &mut Probe<'_>,
    key: &str,
    body: &str,
    what: &str,
) -> Result<(Response, String), Failure> {
    let created = p.post(User::A, Some(key), body)?;
    expect_status(&created, 201, what)?;
    let id = id_of(&created, what)?;
    Ok((created, id))
}

/// Sends each body with `key` and expects `status` for each, then no order.
fn refused_each(
    p: &mut Probe<'_>,
    key: &str,
    bodies: &[String],
    status: u16,
) -> Result<(), Failure> {
    for body in bodies {
        let response = p.post(User::A, Some(key), body)?;
        expect_status(&response, status, &format!("the body {body}"))?;
    }
    p.expect_created(User::A, 0)?;
    Ok(())
}

/// What a client sees of an order, for "unchanged" comparisons.
fn order_facts(order: &Value) -> Value {
    let mut facts = serde_json::Map::new();
    for member in ["id", "item", "quantity", "price", "total_price", "status"] {
        facts.insert(
            member.into(),
            order.get(member).cloned().unwrap_or(Value::Null),
        );
    }
    Value::Object(facts)
}

/// Fails unless `user` reads order `id` as `expected` (its client-visible facts).
fn expect_unchanged(
    p: &mut Probe<'_>,
    user: User,
    id: &str,
    expected: &Value,
) -> Result<(), Failure> {
    let read = p.get_order(user, id)?;
    expect_status(&read, 200, "reading the original order")?;
    let (now, then) = (
        order_facts(&read.json().unwrap_or_default()),
        order_facts(expected),
    );
    ensure(now == then, || {
        format!("the original order changed: it was {then}, it is now {now}")
    })
}

fn atk_01(p: &mut Probe<'_>) -> Result<(), Failure> {
    let body = p.order_body("2", "9.99");
    let response = p.post(User::A, None, &body)?;
    expect_status(&response, 400, "a POST without Idempotency-Key")?;
    p.expect_created(User::A, 0)?;
    Ok(())
}

fn atk_02(p: &mut Probe<'_>) -> Result<(), Failure> {
    let body = p.order_body("2", "9.99");
    for key in ["", " ", "   ", "\t", " \t "] {
        let response = p.post(User::A, Some(key), &body)?;
        expect_status(&response, 400, &format!("the key {key:?}"))?;
    }
    p.expect_created(User::A, 0)?;
    Ok(())
}

fn atk_03(p: &mut Probe<'_>) -> Result<(), Failure> {
    let key = p.key("03");
    let body = p.order_body("2", "9.99");
    let (first, id) = create(p, &key, &body, "the first request")?;

    let tampered = p.post(User::A, Some(&key), &p.order_body("99", "0.01"))?;
    if tampered.status != 409 {
        let quantity = tampered
            .json()
            .and_then(|o| o.get("quantity").cloned())
            .unwrap_or_default();
        return Err(Failure(match tampered.id() {
            Some(same) if same == id && (200..300).contains(&tampered.status) => format!(
                "the changed body (quantity 99, price 0.01) was answered {} with the first order {id} \
                 (quantity {quantity}): the key's first answer was replayed for a different request \
                 instead of 409",
                tampered.status
            ),
            _ => format!(
                "the changed body (quantity 99, price 0.01) was answered {} instead of 409",
                describe_unexpected(&tampered)
            ),
        }));
    }
    expect_unchanged(p, User::A, &id, &first.json().unwrap_or_default())?;
    p.expect_created(User::A, 1)?;
    Ok(())
}

fn atk_04(p: &mut Probe<'_>) -> Result<(), Failure> {
    let body = p.order_body("2", "9.99");
    let (key_a, key_b) = (p.key("04-a"), p.key("04-b"));
    let first = p.post(User::A, Some(&key_a), &body)?;
    let second = p.post(User::A, Some(&key_b), &body)?;
    expect_status(&first, 201, "the first key")?;
    expect_status(&second, 201, "the second key")?;
    let (a, b) = (
        id_of(&first, "the first key")?,
        id_of(&second, "the second key")?,
    );
    ensure(a != b, || {
        format!("two different keys answered the same order {a}")
    })?;
    ensure(!second.replayed(), || {
        "the second key's answer is marked as a replay".into()
    })?;
    p.expect_created(User::A, 2)?;
    Ok(())
}

/// Rounds of the race; each round is a fresh key.
const RACE_ROUNDS: usize = 3;

fn atk_05(p: &mut Probe<'_>) -> Result<(), Failure> {
    let body = p.order_body("2", "9.99");
    let count = p.target.concurrency;
    for round in 1..=RACE_ROUNDS {
        let key = p.key(&format!("05-round-{round}"));
        let answers = p.race(User::A, &key, &body, count);
        let mut responses = Vec::with_capacity(answers.len());
        for answer in answers {
            responses.push(answer?);
        }
        judge_race(p, round, &responses)?;
        p.expect_created(User::A, round)?;
    }
    Ok(())
}

/// One round of identical concurrent requests created one order, answered
/// once with 201; everything else replayed it or was told to retry.
fn judge_race(p: &mut Probe<'_>, round: usize, responses: &[Response]) -> Result<(), Failure> {
    let mut ids: Vec<String> = responses
        .iter()
        .filter(|r| (200..300).contains(&r.status))
        .filter_map(Response::id)
        .collect();
    ids.sort();
    ids.dedup();
    let created = responses.iter().filter(|r| r.status == 201).count();
    let replays = responses.iter().filter(|r| r.status == 200).count();
    let in_progress = responses.iter().filter(|r| r.status == 409).count();
    p.note(format!(
        "round {round}: {} requests: {created}×201, {replays}×200, {in_progress}×409, {} other",
        responses.len(),
        responses.len() - created - replays - in_progress
    ));
    ensure(ids.len() <= 1, || {
        format!(
            "round {round}: {} concurrent requests with one key created {} orders: {}",
            responses.len(),
            ids.len(),
            ids.join(", ")
        )
    })?;
    if let Some(server_error) = responses.iter().find(|r| r.status >= 500) {
        return Err(Failure(format!(
            "round {round}: a concurrent duplicate was answered {}",
            server_error.brief()
        )));
    }
    ensure(created == 1, || {
        format!("round {round}: expected exactly one 201, got {created}")
    })?;
    if let Some(blank) = responses
        .iter()
        .find(|r| r.status == 200 && r.id().is_none())
    {
        return Err(Failure(format!(
            "round {round}: a concurrent duplicate was answered 200 without the order: {}",
            blank.brief()
        )));
    }
    if let Some(other) = responses
        .iter()
        .find(|r| !matches!(r.status, 200 | 201 | 409))
    {
        return Err(Failure(format!(
            "round {round}: a concurrent duplicate was answered {}, neither a replay nor 409",
            other.brief()
        )));
    }
    Ok(())
}

fn atk_06(p: &mut Probe<'_>) -> Result<(), Failure> {
    let bodies = [p.order_body("-1", "9.99"), p.order_body("-1000000", "9.99")];
    refused_each(p, &p.key("06"), &bodies, 422)
}

fn atk_07(p: &mut Probe<'_>) -> Result<(), Failure> {
    let bodies = [p.order_body("0", "9.99")];
    refused_each(p, &p.key("07"), &bodies, 422)
}

fn atk_08(p: &mut Probe<'_>) -> Result<(), Failure> {
    let item = p.target.item();
    let bodies = [
        r#"{"quantity":2,"price":9.99}"#.to_owned(),
        format!(r#"{{"item":"{item}","price":9.99}}"#),
        format!(r#"{{"item":"{item}","quantity":2}}"#),
        "{}".to_owned(),
    ];
    refused_each(p, &p.key("08"), &bodies, 422)
}

/// An origin no deployment allows.
const FOREIGN_ORIGIN: &str = "https://atk-attacker.example";
const CORS_GRANTS: &[&str] = &[
    "Access-Control-Allow-Origin",
    "Access-Control-Allow-Methods",
    "Access-Control-Allow-Credentials",
];

/// Fails when `response` grants the foreign origin anything.
fn expect_no_grant(response: &Response, what: &str) -> Result<(), Failure> {
    for grant in CORS_GRANTS {
        if let Some(value) = response.header(grant) {
            return Err(Failure(format!(
                "{what}: the answer grants {FOREIGN_ORIGIN} `{grant}: {value}`, so a foreign page could read it"
            )));
        }
    }
    Ok(())
}

fn atk_09(p: &mut Probe<'_>) -> Result<(), Failure> {
    let base = p.base().to_owned();
    let key = p.key("09");
    for content_type in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
    ] {
        let form = p.send(
            Call::new("POST", &base)
                .by(User::A)
                .key(Some(&key))
                .header("Origin", FOREIGN_ORIGIN)
                .header("Content-Type", content_type)
                .body("item=Widget&quantity=2&price=9.99"),
        )?;
        let what = format!("the {content_type} POST");
        expect_status(&form, 415, &what)?;
        expect_no_grant(&form, &what)?;
    }
    p.expect_created(User::A, 0)?;

    let preflight = p.send(
        Call::new("OPTIONS", &base)
            .header("Origin", FOREIGN_ORIGIN)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization, content-type, idempotency-key",
            ),
    )?;
    ensure(preflight.status < 500, || {
        format!("the preflight was answered {}", preflight.brief())
    })?;
    expect_no_grant(&preflight, "the preflight")?;

    let json_key = p.key("09-json");
    let body = p.order_body("2", "9.99");
    let json_post = p.send(
        Call::new("POST", &base)
            .by(User::A)
            .key(Some(&json_key))
            .header("Origin", FOREIGN_ORIGIN)
            .json(body),
    )?;
    expect_status(&json_post, 201, "a JSON POST from the foreign origin")?;
    expect_no_grant(&json_post, "a JSON POST from the foreign origin")?;
    p.expect_created(User::A, 1)?;
    Ok(())
}

fn atk_10(p: &mut Probe<'_>) -> Result<(), Failure> {
    let bodies = [p.order_body("2", "-0.01"), p.order_body("2", "-9.99")];
    refused_each(p, &p.key("10"), &bodies, 422)
}

/// The quantities ATK-11 sends: none is a JSON integer literal.
pub const NON_INTEGER_QUANTITIES: &[&str] = &[r#""1""#, "1.5", "1.0", "1e2", "true", "null"];

fn atk_11(p: &mut Probe<'_>) -> Result<(), Failure> {
    let bodies: Vec<String> = NON_INTEGER_QUANTITIES
        .iter()
        .map(|q| p.order_body(q, "9.99"))
        .collect();
    refused_each(p, &p.key("11"), &bodies, 422)
}

fn atk_12(p: &mut Probe<'_>) -> Result<(), Failure> {
    let run = p.target.run_id.clone();
    let keys = [
        format!("'; DROP TABLE orders; -- {run}"),
        format!("x' OR '1'='1 {run}"),
        format!(r#"\"); DELETE FROM idempotency_ledger; -- {run}"#),
    ];
    let body = p.order_body("2", "9.99");
    for key in &keys {
        let (_, id) = create(p, key, &body, &format!("the key {key:?}"))?;
        let retry = p.post(User::A, Some(key), &body)?;
        expect_status(&retry, 200, &format!("the retry with the key {key:?}"))?;
        ensure(retry.id().as_deref() == Some(id.as_str()), || {
            format!(
                "the retry with the key {key:?} answered {} instead of the order {id}",
                describe_unexpected(&retry)
            )
        })?;
    }
    p.expect_created(User::A, keys.len())?;
    Ok(())
}

fn ext_01(p: &mut Probe<'_>) -> Result<(), Failure> {
    let key = p.key("ext-01");
    let body = p.order_body("2", "9.99");
    let (_, a) = create(p, &key, &body, "user A's request")?;
    let bobs = p.post(User::B, Some(&key), &body)?;
    if bobs.id().as_deref() == Some(a.as_str()) {
        return Err(Failure(format!(
            "user B's request with user A's key was answered {} with user A's order {a}: \
             keys are not scoped to their user",
            bobs.status
        )));
    }
    expect_status(&bobs, 201, "user B's request with the same key")?;
    ensure(!bobs.replayed(), || {
        "user B's answer is marked as a replay".into()
    })?;
    let again = p.post(User::A, Some(&key), &body)?;
    expect_status(&again, 200, "user A's retry")?;
    ensure(again.id().as_deref() == Some(a.as_str()), || {
        format!(
            "user A's retry answered {} instead of A's order {a}",
            describe_unexpected(&again)
        )
    })?;
    p.expect_created(User::A, 1)?;
    p.expect_created(User::B, 1)?;
    Ok(())
}

fn ext_02(p: &mut Probe<'_>) -> Result<(), Failure> {
    let body = p.order_body("1", "250.00");
    let (created, id) = create(p, &p.key("ext-02"), &body, "user A's order")?;
    let missing = uuid::Uuid::now_v7().to_string();
    let (base, patch) = (p.base().to_owned(), r#"{"quantity":99,"price":0.01}"#);

    for method in ["GET", "PATCH", "DELETE"] {
        let answers: Vec<Response> = [(&id, "foreign"), (&missing, "missing")]
            .into_iter()
            .map(|(target_id, whose)| {
                let path = format!("{base}/{target_id}");
                let mut call = Call::new(method, &path).by(User::B);
                if method != "GET" {
                    let suffix = format!("ext-02-{}-{whose}", method.to_ascii_lowercase());
                    call = call.key(Some(&p.key(&suffix)));
                }
                if method == "PATCH" {
                    call = call.json(patch);
                }
                p.send(call)
            })
            .collect::<Result<_, _>>()?;
        let (foreign, nonexistent) = (&answers[0], &answers[1]);
        expect_status(
            foreign,
            404,
            &format!("user B's {method} of user A's order"),
        )?;
        let (f, n) = (
            foreign.body.replace(&id, "{id}"),
            nonexistent.body.replace(&missing, "{id}"),
        );
        ensure(f == n && foreign.status == nonexistent.status, || {
            format!(
                "user B's {method} of user A's order ({}) differs from one of a nonexistent order ({}): \
                     it tells that the order exists",
                foreign.brief(),
                nonexistent.brief()
            )
        })?;
    }
    expect_unchanged(p, User::A, &id, &created.json().unwrap_or_default())?;
    let bobs_list = p.run_order_ids(User::B)?;
    ensure(!bobs_list.contains(&id), || {
        format!("user B's list shows user A's order {id}")
    })?;
    p.expect_created(User::B, 0)?;
    Ok(())
}

fn ext_03(p: &mut Probe<'_>) -> Result<(), Failure> {
    let body = p.order_body("1", "1");
    let prefix = p.key("ext-03-");
    let too_long = format!("{prefix}{}", "k".repeat(256 - prefix.len()));
    let refused = p.post(User::A, Some(&too_long), &body)?;
    expect_status(&refused, 400, "a key of 256 characters")?;
    p.expect_created(User::A, 0)?;
    let longest = format!("{prefix}{}", "k".repeat(255 - prefix.len()));
    let accepted = p.post(User::A, Some(&longest), &body)?;
    expect_status(&accepted, 201, "a key of exactly 255 characters")?;
    p.expect_created(User::A, 1)?;
    Ok(())
}

fn ext_04(p: &mut Probe<'_>) -> Result<(), Failure> {
    let key = p.key("ext-04");
    let body = p.order_body("2", "9.99");
    let (created, _) = create(p, &key, &body, "the first request")?;
    ensure(created.header("Location").is_some(), || {
        "the 201 has no Location".into()
    })?;
    for attempt in 1..=2 {
        let replay = p.post(User::A, Some(&key), &body)?;
        let what = format!("retry {attempt}");
        expect_status(&replay, 200, &what)?;
        ensure(replay.replayed(), || {
            format!("{what}: no `Idempotent-Replayed: true`")
        })?;
        ensure(replay.body == created.body, || {
            format!(
                "{what}: the body differs from the first answer: {}",
                replay.brief()
            )
        })?;
        for header in ["Location", "Content-Type"] {
            ensure(replay.header(header) == created.header(header), || {
                format!(
                    "{what}: {header} is {}, the first answer had {}",
                    replay.header(header).unwrap_or("(none)"),
                    created.header(header).unwrap_or("(none)")
                )
            })?;
        }
    }
    p.expect_created(User::A, 1)?;
    Ok(())
}
