//! The attacks of CONTRACT §5 and the extras a client can judge over HTTP, one
//! definition each. A check judges what the attack achieved — by the
//! target's state (which orders exist, what an order holds) and by what its
//! answers hand out — never how the target is built: an attack that achieved
//! nothing is blocked, however it was refused; a refusal other than this
//! contract's is a deviation. Every request and answer stays as evidence.
//!
//! A request that got no answer is listed (by the probe) and is a deviation
//! where the contract says it is answered; it never stops a check from
//! reading the target's state: orders made, changed or shown are evidence
//! whatever else went wrong. Only when a check needs an answer to go on (the
//! id of the order its first request made) does a missing one keep it from
//! being judged, and its reason names that request.

use std::collections::BTreeMap;

use serde_json::Value;

use super::probe::{Call, CannotJudge, Probe, Response, User};

/// Who a check acts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// One user: user A (`--token`), or nobody on a target without authentication.
    OneUser,
    /// Two users (`--token` and `--token-b`): it compares what each may see.
    TwoUsers,
}

/// One attack: what it sends, what this contract answers, what would mean
/// the attack achieved something, and the check that judges it.
pub struct Attack {
    pub id: &'static str,
    pub title: &'static str,
    pub sends: &'static str,
    /// This contract's answer; another refusal is a deviation.
    pub expects: &'static str,
    /// What makes the verdict EXPOSED (besides an answer that shows internals).
    pub exposed_if: &'static str,
    pub needs: Needs,
    pub(crate) check: fn(&mut Probe<'_>) -> Result<(), CannotJudge>,
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
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        check: atk_01,
    },
    Attack {
        id: "ATK-02",
        title: "empty or whitespace-only key",
        sends: "a valid order with the keys \"\", \" \", \"   \", \"\\t\", \" \\t \"",
        expects: "400 for each; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        check: atk_02,
    },
    Attack {
        id: "ATK-03",
        title: "replay a key with a changed body",
        sends: "an order (quantity 2, price 9.99), then the same key with quantity 99, price 0.01",
        expects: "201, then 409; the original order unchanged; no second order",
        exposed_if: "the changed body is answered 2xx (the first order replayed for a different request), the original order changes, or a second order appears",
        needs: Needs::OneUser,
        check: atk_03,
    },
    Attack {
        id: "ATK-04",
        title: "two different keys",
        sends: "the same order twice, each with its own key",
        expects: "two 201s with two different orders (by design)",
        exposed_if: "the second key is answered with the first key's order (two keys collide)",
        needs: Needs::OneUser,
        check: atk_04,
    },
    Attack {
        id: "ATK-05",
        title: "concurrent requests with one key",
        sends: "--concurrency identical POSTs with one key, released together (3 rounds)",
        expects: "one 201 and one order per round; every other answer a 200 replay of that order or a 409 in progress; no 5xx",
        exposed_if: "a round creates more than one order",
        needs: Needs::OneUser,
        check: atk_05,
    },
    Attack {
        id: "ATK-06",
        title: "negative quantity",
        sends: "quantity -1 and -1000000",
        expects: "422; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        check: atk_06,
    },
    Attack {
        id: "ATK-07",
        title: "zero quantity",
        sends: "quantity 0",
        expects: "422; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        check: atk_07,
    },
    Attack {
        id: "ATK-08",
        title: "missing required fields",
        sends: "an order without item, without quantity, without price, and {}",
        expects: "422 for each; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        check: atk_08,
    },
    Attack {
        id: "ATK-09",
        title: "cross-origin browser POST",
        sends: "form, multipart and text/plain POSTs from a foreign Origin, a CORS preflight, a JSON POST from that Origin",
        expects: "415 for non-JSON bodies and nothing created by them; no Access-Control-Allow-* for the foreign origin",
        exposed_if: "a non-JSON POST creates an order, or an answer grants the foreign origin access",
        needs: Needs::OneUser,
        check: atk_09,
    },
    Attack {
        id: "ATK-10",
        title: "negative price",
        sends: "price -0.01 and -9.99",
        expects: "422; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        check: atk_10,
    },
    Attack {
        id: "ATK-11",
        title: "quantity as a string, float or other non-integer",
        sends: "quantity \"1\", 1.5, 1.0, 1e2, true, null",
        expects: "422 for each; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        check: atk_11,
    },
    Attack {
        id: "ATK-12",
        title: "SQL injection in the key",
        sends: "keys such as '; DROP TABLE orders; -- , each sent twice",
        expects: "an opaque key: 201, then a 200 replay of the same order; one order per key; listing still works",
        exposed_if: "a retry creates a second order, or the orders created before the injection are gone",
        needs: Needs::OneUser,
        check: atk_12,
    },
    Attack {
        id: "EXT-01",
        title: "another user's key (tenancy)",
        sends: "user A and user B each POST the same order with the same key",
        expects: "two unrelated keys: B gets its own 201 and its own order, not A's replay",
        exposed_if: "user B is answered with user A's order, or the key creates a second order",
        needs: Needs::TwoUsers,
        check: ext_01,
    },
    Attack {
        id: "EXT-02",
        title: "another user's order (tenancy)",
        sends: "user B reads, changes and cancels user A's order, and a nonexistent one",
        expects: "404 exactly like a nonexistent order; A's order unchanged and absent from B's list",
        exposed_if: "user B reads, changes or cancels user A's order, or sees it in its list",
        needs: Needs::TwoUsers,
        check: ext_02,
    },
    Attack {
        id: "EXT-03",
        title: "key over 255 characters",
        sends: "a key of 256 characters, then one of exactly 255",
        expects: "400 and nothing created for 256; 201 for 255",
        exposed_if: "the key of 256 characters creates an order",
        needs: Needs::OneUser,
        check: ext_03,
    },
    Attack {
        id: "EXT-04",
        title: "replay header preservation",
        sends: "an order, then the same request twice",
        expects: "each retry: 200, Idempotent-Replayed: true, the same body, Location and Content-Type",
        exposed_if: "a retry creates an order, or answers with a different order",
        needs: Needs::OneUser,
        check: ext_04,
    },
];

/// Requests this contract refuses with `want`, each with what it was and
/// its answer, if one came: any other refusal (or a 2xx that names no order)
/// is a deviation, one per status, and so is no answer. Whether they created
/// anything is judged by the state afterwards.
fn refusals(p: &mut Probe<'_>, answers: &[(String, Option<Response>)], want: u16) {
    let unanswered: Vec<&str> = answers
        .iter()
        .filter(|(_, response)| response.is_none())
        .map(|(what, _)| what.as_str())
        .collect();
    if !unanswered.is_empty() {
        p.deviate(format!(
            "no answer where the contract says {want}: {}",
            unanswered.join(", ")
        ));
    }
    let answers: Vec<(&String, &Response)> = answers
        .iter()
        .filter_map(|(what, response)| response.as_ref().map(|r| (what, r)))
        .collect();
    let mut by_status: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for (what, response) in answers {
        let names_an_order = response.success() && p.id_in(response).is_some();
        if response.status != want && !names_an_order {
            by_status.entry(response.status).or_default().push(what);
        }
    }
    for (status, whats) in by_status {
        p.deviate(format!(
            "{status} where the contract says {want}: {}",
            whats.join(", ")
        ));
    }
}

/// Exposed when the attack created an order for `user`: `what` did it.
fn nothing_created(p: &mut Probe<'_>, user: User, what: &str) -> Result<(), CannotJudge> {
    let created = p.created(user)?;
    if !created.is_empty() {
        p.expose(format!(
            "{what} created {} order(s): {}",
            created.len(),
            created.join(", ")
        ));
    }
    Ok(())
}

/// The id of the order a create that must succeed (the control did) made.
fn created_id(p: &Probe<'_>, response: &Response, what: &str) -> Result<String, CannotJudge> {
    match p.id_in(response) {
        Some(id) if response.success() => Ok(id),
        _ => Err(CannotJudge(format!(
            "{what} was answered {} although the control's create succeeded: the check cannot go on",
            response.brief()
        ))),
    }
}

/// What a client sees of an order, for "unchanged" comparisons: its id,
/// item, quantity and price, and its total and status if it has them.
fn order_facts(p: &Probe<'_>, order: &Value) -> Value {
    let shape = p.shape();
    let mut facts = serde_json::Map::new();
    facts.insert(
        "id".into(),
        shape.id_of(order).map(Value::from).unwrap_or_default(),
    );
    for member in [&shape.item_field, &shape.quantity_field, &shape.price_field] {
        facts.insert(
            member.clone(),
            order.get(member).cloned().unwrap_or_default(),
        );
    }
    for member in ["total_price", "status"] {
        if let Some(value) = order.get(member) {
            facts.insert(member.into(), value.clone());
        }
    }
    Value::Object(facts)
}

/// Exposed when `user` reads order `id` otherwise than `expected` (its
/// client-visible facts): `by` changed it.
fn expect_unchanged(
    p: &mut Probe<'_>,
    user: User,
    id: &str,
    expected: &Response,
    by: &str,
) -> Result<(), CannotJudge> {
    let read = p.get_order(user, id)?;
    if !read.success() {
        return Err(CannotJudge(format!(
            "reading the original order {id} back answered {}",
            read.brief()
        )));
    }
    let then = order_facts(p, &p.order_in(expected).unwrap_or_default());
    let now = order_facts(p, &p.order_in(&read).unwrap_or_default());
    if now != then {
        p.expose(format!(
            "{by} changed the original order: it was {then}, it is now {now}"
        ));
    }
    Ok(())
}

/// The member `field` of an answer's JSON body, as text.
fn member(p: &Probe<'_>, response: &Response, field: &str) -> String {
    p.order_in(response)
        .and_then(|o| o.get(field).cloned())
        .map(|v| v.to_string())
        .unwrap_or_else(|| "(none)".into())
}

fn atk_01(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let body = p.order_body("2", "9.99");
    let what = "a POST without Idempotency-Key".to_owned();
    let response = p.post(User::A, None, &body).ok();
    refusals(p, &[(what.clone(), response)], 400);
    nothing_created(p, User::A, &what)
}

fn atk_02(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let body = p.order_body("2", "9.99");
    let mut answers = Vec::new();
    for key in ["", " ", "   ", "\t", " \t "] {
        let response = p.post(User::A, Some(key), &body).ok();
        answers.push((format!("the key {key:?}"), response));
    }
    refusals(p, &answers, 400);
    nothing_created(p, User::A, "a blank key")
}

fn atk_03(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let key = p.key("03");
    let body = p.order_body("2", "9.99");
    let first = p.post(User::A, Some(&key), &body)?;
    let id = created_id(p, &first, "the first request")?;

    let changed = "the changed body (quantity 99, price 0.01) with the same key";
    let tampered = p
        .post(User::A, Some(&key), &p.order_body("99", "0.01"))
        .ok();
    let Some(tampered) = tampered else {
        // No answer to judge: what it did is in the state.
        refusals(p, &[(changed.to_owned(), None)], 409);
        expect_unchanged(p, User::A, &id, &first, changed)?;
        return more_than_one_created(p, "one key and its changed body");
    };
    if tampered.success() {
        match p.id_in(&tampered) {
            Some(same) if same == id => {
                let quantity = member(p, &tampered, &p.shape().quantity_field);
                p.expose(format!(
                    "{changed} was answered {} with the first order {id} (quantity {quantity}): \
                     the key's first answer was replayed for a different request, so the client \
                     believes that a request which never ran succeeded",
                    tampered.status
                ));
            }
            Some(other) => p.expose(format!(
                "{changed} was answered {} with another order {other}",
                tampered.status
            )),
            None => p.deviate(format!(
                "{} (no order) where the contract says 409: {changed}",
                tampered.status
            )),
        }
    } else {
        refusals(p, &[(changed.to_owned(), Some(tampered))], 409);
    }
    expect_unchanged(p, User::A, &id, &first, changed)?;
    more_than_one_created(p, "one key and its changed body")
}

/// Exposed when user A has more than one new order: `what` made them.
fn more_than_one_created(p: &mut Probe<'_>, what: &str) -> Result<(), CannotJudge> {
    let created = p.created(User::A)?;
    if created.len() > 1 {
        p.expose(format!(
            "{what} created {} orders: {}",
            created.len(),
            created.join(", ")
        ));
    }
    Ok(())
}

fn atk_04(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let body = p.order_body("2", "9.99");
    let (key_a, key_b) = (p.key("04-a"), p.key("04-b"));
    let first = p.post(User::A, Some(&key_a), &body)?;
    let second = p.post(User::A, Some(&key_b), &body).ok();
    let a = created_id(p, &first, "the first key")?;
    match second.as_ref() {
        None => p.deviate("no answer where the contract says 201: the second key"),
        Some(second) => judge_second_key(p, &a, second),
    }
    let created = p.created(User::A)?;
    if created.len() > 2 {
        p.expose(format!(
            "two keys created {} orders: {}",
            created.len(),
            created.join(", ")
        ));
    }
    Ok(())
}

/// ATK-04's second key, answered: its own order, not the first key's.
fn judge_second_key(p: &mut Probe<'_>, a: &str, second: &Response) {
    match p.id_in(second).filter(|_| second.success()) {
        Some(b) if b == a => p.expose(format!(
            "the second key was answered {} with the first key's order {a}: two different keys \
             collide, and the second request's order was never created",
            second.status
        )),
        Some(_) if second.replayed() => {
            p.deviate("the second key's answer is marked as a replay (Idempotent-Replayed)");
        }
        Some(_) => {}
        None => p.deviate(format!(
            "{} where the contract says 201: the second key",
            second.brief()
        )),
    }
}

/// Rounds of the race; each round is a fresh key.
const RACE_ROUNDS: usize = 3;

fn atk_05(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let body = p.order_body("2", "9.99");
    let count = p.target.concurrency;
    let mut before: Vec<String> = Vec::new();
    for round in 1..=RACE_ROUNDS {
        let key = p.key(&format!("05-round-{round}"));
        let answers = p.race(User::A, &key, &body, count);
        let sent = answers.len();
        let responses: Vec<Response> = answers.into_iter().filter_map(Result::ok).collect();
        let unanswered = sent - responses.len();
        if unanswered > 0 {
            p.deviate(format!(
                "round {round}: {unanswered} of {sent} concurrent duplicates got no answer where \
                 the contract says a 201, a replay or 409 in progress"
            ));
        }
        judge_race(p, round, &responses, unanswered);
        // What the round made is in the state, answered or not.
        let created = p.created(User::A)?;
        let this_round: Vec<String> = created
            .iter()
            .filter(|id| !before.contains(id))
            .cloned()
            .collect();
        if this_round.len() > 1 {
            p.expose(format!(
                "round {round}: {sent} concurrent requests with one key created {} orders: {}",
                this_round.len(),
                this_round.join(", ")
            ));
        }
        if this_round.is_empty() && p.exposures.is_empty() {
            let why = match unanswered {
                0 => String::new(),
                n => format!(" ({n} of them got no answer: see the requests without an answer)"),
            };
            return Err(CannotJudge(format!(
                "round {round}: none of {sent} concurrent requests created an order{why}: the race \
                 cannot be judged"
            )));
        }
        before = created;
    }
    Ok(())
}

/// One round of identical concurrent requests, as far as they were answered:
/// this contract answers one 201 and replays it (200) or says 409 in
/// progress to the others; anything else is a deviation (what was created
/// is judged by the state).
fn judge_race(p: &mut Probe<'_>, round: usize, responses: &[Response], unanswered: usize) {
    let created = responses.iter().filter(|r| r.status == 201).count();
    let replays = responses.iter().filter(|r| r.status == 200).count();
    let in_progress = responses.iter().filter(|r| r.status == 409).count();
    p.note(format!(
        "round {round}: {} requests: {created}×201, {replays}×200, {in_progress}×409, {} other, \
         {unanswered} without an answer",
        responses.len() + unanswered,
        responses.len() - created - replays - in_progress
    ));
    if created > 1 {
        p.deviate(format!(
            "{created} concurrent duplicates were answered 201 where the contract says one 201 \
             and replays (200)"
        ));
    }
    if let Some(blank) = responses
        .iter()
        .find(|r| r.status == 200 && p.id_in(r).is_none())
    {
        p.deviate(format!(
            "a concurrent duplicate was answered 200 without the order: {}",
            blank.brief()
        ));
    }
    if let Some(other) = responses
        .iter()
        .find(|r| !matches!(r.status, 200 | 201 | 409))
    {
        p.deviate(format!(
            "a concurrent duplicate was answered {} where the contract says a replay or 409 in progress",
            other.brief()
        ));
    }
}

/// Sends each body (with what it is) with `key`; this contract refuses
/// each with `status` and creates nothing.
fn refused_each(
    p: &mut Probe<'_>,
    key: &str,
    bodies: &[(String, String)],
    status: u16,
) -> Result<(), CannotJudge> {
    let mut answers = Vec::new();
    for (what, body) in bodies {
        let response = p.post(User::A, Some(key), body).ok();
        answers.push((what.clone(), response));
    }
    refusals(p, &answers, status);
    let what: Vec<&str> = bodies.iter().map(|(w, _)| w.as_str()).collect();
    nothing_created(p, User::A, &what.join(" or "))
}

fn atk_06(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let bodies = [
        ("quantity -1".into(), p.order_body("-1", "9.99")),
        ("quantity -1000000".into(), p.order_body("-1000000", "9.99")),
    ];
    refused_each(p, &p.key("06"), &bodies, 422)
}

fn atk_07(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let bodies = [("quantity 0".into(), p.order_body("0", "9.99"))];
    refused_each(p, &p.key("07"), &bodies, 422)
}

fn atk_08(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let (item, shape) = (p.target.item(), p.shape().clone());
    let bodies = [
        (
            format!("no {}", shape.item_field),
            shape.body(None, Some("2"), Some("9.99")),
        ),
        (
            format!("no {}", shape.quantity_field),
            shape.body(Some(&item), None, Some("9.99")),
        ),
        (
            format!("no {}", shape.price_field),
            shape.body(Some(&item), Some("2"), None),
        ),
        ("{}".into(), "{}".into()),
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

/// Exposed when `response` grants the foreign origin anything.
fn expect_no_grant(p: &mut Probe<'_>, response: &Response, what: &str) {
    for grant in CORS_GRANTS {
        if let Some(value) = response.header(grant) {
            p.expose(format!(
                "{what}: the answer grants {FOREIGN_ORIGIN} `{grant}: {value}`, so a foreign page could read it"
            ));
        }
    }
}

fn atk_09(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let base = p.base().to_owned();
    let key = p.key("09");
    let shape = p.shape().clone();
    let form = format!(
        "{}={}&{}=2&{}=9.99",
        shape.item_field,
        p.target.item(),
        shape.quantity_field,
        shape.price_field
    );
    let mut answers = Vec::new();
    for content_type in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
    ] {
        let response = p
            .send(
                Call::new("POST", &base)
                    .by(User::A)
                    .key(Some(&key))
                    .header("Origin", FOREIGN_ORIGIN)
                    .header("Content-Type", content_type)
                    .body(form.clone()),
            )
            .ok();
        let what = format!("the {content_type} POST");
        if let Some(response) = &response {
            expect_no_grant(p, response, &what);
        }
        answers.push((what, response));
    }
    refusals(p, &answers, 415);
    nothing_created(p, User::A, "the non-JSON POSTs from a foreign origin")?;

    let preflight = p.send(
        Call::new("OPTIONS", &base)
            .header("Origin", FOREIGN_ORIGIN)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization, content-type, idempotency-key",
            ),
    );
    match preflight {
        Ok(preflight) => {
            if preflight.status >= 500 {
                p.deviate(format!("the preflight was answered {}", preflight.brief()));
            }
            expect_no_grant(p, &preflight, "the preflight");
        }
        Err(_) => p.deviate("the preflight got no answer"),
    }

    let json_key = p.key("09-json");
    let body = p.order_body("2", "9.99");
    let json_post = p.send(
        Call::new("POST", &base)
            .by(User::A)
            .key(Some(&json_key))
            .header("Origin", FOREIGN_ORIGIN)
            .json(body),
    );
    match json_post {
        Ok(json_post) => expect_no_grant(p, &json_post, "a JSON POST from the foreign origin"),
        Err(_) => p.deviate("a JSON POST from the foreign origin got no answer"),
    }
    Ok(())
}

fn atk_10(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let bodies = [
        ("price -0.01".into(), p.order_body("2", "-0.01")),
        ("price -9.99".into(), p.order_body("2", "-9.99")),
    ];
    refused_each(p, &p.key("10"), &bodies, 422)
}

/// The quantities ATK-11 sends: none is a JSON integer literal.
pub const NON_INTEGER_QUANTITIES: &[&str] = &[r#""1""#, "1.5", "1.0", "1e2", "true", "null"];

fn atk_11(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let bodies: Vec<(String, String)> = NON_INTEGER_QUANTITIES
        .iter()
        .map(|q| (format!("quantity {q}"), p.order_body(q, "9.99")))
        .collect();
    refused_each(p, &p.key("11"), &bodies, 422)
}

fn atk_12(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let run = p.target.run_id.clone();
    let keys = [
        format!("'; DROP TABLE orders; -- {run}"),
        format!("x' OR '1'='1 {run}"),
        format!(r#"\"); DELETE FROM idempotency_ledger; -- {run}"#),
    ];
    let body = p.order_body("2", "9.99");
    // Keys whose first request made (or may have made: no answer) an order.
    let (mut accepted, mut not_replayed) = (0, BTreeMap::<u16, Vec<String>>::new());
    for key in &keys {
        let Ok(first) = p.post(User::A, Some(key), &body) else {
            p.deviate(format!(
                "no answer where the contract says 201 (an opaque key): the key {key:?}"
            ));
            accepted += 1;
            continue;
        };
        let Some(id) = p.id_in(&first).filter(|_| first.success()) else {
            p.deviate(format!(
                "{} where the contract says 201 (an opaque key): the key {key:?}",
                first.status
            ));
            continue;
        };
        accepted += 1;
        let Ok(retry) = p.post(User::A, Some(key), &body) else {
            p.deviate(format!(
                "no answer where the contract says a 200 replay of order {id}: the retry with the key {key:?}"
            ));
            continue;
        };
        match p.id_in(&retry).filter(|_| retry.success()) {
            Some(same) if same == id && retry.status != 200 => not_replayed
                .entry(retry.status)
                .or_default()
                .push(format!("{key:?}")),
            Some(_) => {}
            None => p.deviate(format!(
                "{} where the contract says a 200 replay of order {id}: the retry with the key {key:?}",
                retry.brief()
            )),
        }
    }
    for (status, keys) in not_replayed {
        p.deviate(format!(
            "{status} where the contract says 200 (a replay): the retries with the keys {}",
            keys.join(", ")
        ));
    }
    let created = p.created(User::A)?;
    if created.len() > accepted {
        p.expose(format!(
            "{} orders for {accepted} key(s) with SQL in them, each sent twice: {}",
            created.len(),
            created.join(", ")
        ));
    }
    let control = p.control_id(User::A);
    if let Some(control) = control
        && !p.still_there(User::A, &control)
    {
        p.expose(format!(
            "the control's order {control} is gone after the keys with SQL in them"
        ));
    }
    Ok(())
}

fn ext_01(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let key = p.key("ext-01");
    let body = p.order_body("2", "9.99");
    let first = p.post(User::A, Some(&key), &body)?;
    let a = created_id(p, &first, "user A's request")?;
    if let Ok(bobs) = p.post(User::B, Some(&key), &body) {
        judge_other_users_key(p, &a, &bobs);
    } else {
        p.deviate("no answer where the contract says 201: user B's request with a key user A used");
    }
    match p.post(User::A, Some(&key), &body) {
        Ok(again) => judge_own_retry(p, &a, &again),
        Err(_) => p.deviate("no answer where the contract says a 200 replay: user A's retry"),
    }
    let created = p.created(User::A)?;
    if created.len() > 1 {
        p.expose(format!(
            "user A's key created {} orders for user A: {}",
            created.len(),
            created.join(", ")
        ));
    }
    Ok(())
}

/// EXT-01: user B's request with user A's key, answered.
fn judge_other_users_key(p: &mut Probe<'_>, a: &str, bobs: &Response) {
    match p.id_in(bobs).filter(|_| bobs.success()) {
        Some(same) if same == a => p.expose(format!(
            "user B's request with user A's key was answered {} with user A's order {a}: \
             keys are not scoped to their user, so B reads A's order",
            bobs.status
        )),
        Some(_) if bobs.replayed() => {
            p.deviate("user B's answer is marked as a replay (Idempotent-Replayed)");
        }
        Some(_) => {}
        None => p.deviate(format!(
            "{} where the contract says 201: user B's request with a key user A used \
             (keys are per user)",
            bobs.brief()
        )),
    }
}

/// EXT-01: user A's retry of its own request, answered.
fn judge_own_retry(p: &mut Probe<'_>, a: &str, again: &Response) {
    match p.id_in(again).filter(|_| again.success()) {
        Some(same) if same == a && again.status != 200 => p.deviate(format!(
            "{} where the contract says 200 (a replay): user A's retry",
            again.status
        )),
        Some(_) => {}
        None => p.deviate(format!(
            "{} where the contract says a 200 replay of order {a}: user A's retry",
            again.brief()
        )),
    }
}

fn ext_02(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let body = p.order_body("1", "250.00");
    let key = p.key("ext-02");
    let first = p.post(User::A, Some(&key), &body)?;
    let id = created_id(p, &first, "user A's order")?;
    // A nonexistent id of the same kind: a number for numeric ids.
    let missing = if id.bytes().all(|b| b.is_ascii_digit()) {
        "9007199254740991".to_owned()
    } else {
        uuid::Uuid::now_v7().to_string()
    };
    let shape = p.shape().clone();
    let patch = format!(
        r#"{{"{}":99,"{}":0.01}}"#,
        shape.quantity_field, shape.price_field
    );
    for method in ["GET", "PATCH", "DELETE"] {
        let mut answers = Vec::new();
        for (target_id, whose) in [(&id, "foreign"), (&missing, "missing")] {
            let path = p.target.order_path(target_id);
            let mut call = Call::new(method, &path).by(User::B);
            let suffix = format!("ext-02-{}-{whose}", method.to_ascii_lowercase());
            let key = p.key(&suffix);
            if method != "GET" {
                call = call.key(Some(&key));
            }
            if method == "PATCH" {
                call = call.json(patch.clone());
            }
            answers.push(p.send(call).ok());
        }
        let what = format!("user B's {method} of user A's order");
        let (Some(foreign), Some(nonexistent)) = (&answers[0], &answers[1]) else {
            p.deviate(format!(
                "no answer where the contract says 404: {what}, or of a nonexistent order"
            ));
            continue;
        };
        if foreign.success() {
            p.expose(format!(
                "{what} {id} was answered {}: {}",
                foreign.status,
                foreign.brief()
            ));
            continue;
        }
        let (f, n) = (
            without_occurrence(&foreign.body).replace(&id, "{id}"),
            without_occurrence(&nonexistent.body).replace(&missing, "{id}"),
        );
        if f != n || foreign.status != nonexistent.status {
            p.deviate(format!(
                "{what} ({}) differs from one of a nonexistent order ({}): it tells B that the order exists",
                foreign.brief(),
                nonexistent.brief()
            ));
        } else if foreign.status != 404 {
            p.deviate(format!(
                "{} where the contract says 404: {what}",
                foreign.status
            ));
        }
    }
    expect_unchanged(p, User::A, &id, &first, "user B's requests")?;
    if p.lists(User::B) {
        let bobs_list = p.run_order_ids(User::B)?;
        if bobs_list.contains(&id) {
            p.expose(format!("user B's list shows user A's order {id}"));
        }
    }
    Ok(())
}

/// `body` without what names one occurrence rather than the answer: an
/// RFC 9457 problem's `instance` (this service's is the request id, so two
/// answers that say the same thing differ in it). Any other body as it is.
fn without_occurrence(body: &str) -> String {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(mut members) if members.contains_key("instance") => {
            members.remove("instance");
            serde_json::Value::Object(members).to_string()
        }
        _ => body.to_owned(),
    }
}

fn ext_03(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let body = p.order_body("2", "9.99");
    let prefix = p.key("ext-03-");
    let too_long = format!("{prefix}{}", "k".repeat(256 - prefix.len()));
    let what = "a key of 256 characters".to_owned();
    let refused = p.post(User::A, Some(&too_long), &body).ok();
    let unbounded =
        "keys are not bounded, so a client can make the target store a key of any length";
    let accepted = refused
        .as_ref()
        .and_then(|r| p.id_in(r).filter(|_| r.success()));
    match (&accepted, refused) {
        (Some(id), Some(refused)) => p.expose(format!(
            "{what} was accepted ({} with order {id}): {unbounded}",
            refused.status
        )),
        (_, refused) => refusals(p, &[(what.clone(), refused)], 400),
    }
    let created: Vec<String> = p
        .created(User::A)?
        .into_iter()
        .filter(|id| Some(id) != accepted.as_ref())
        .collect();
    if !created.is_empty() {
        p.expose(format!(
            "{what} created order {}: {unbounded}",
            created.join(", ")
        ));
    }
    let longest = format!("{prefix}{}", "k".repeat(255 - prefix.len()));
    match p.post(User::A, Some(&longest), &body) {
        Ok(accepted) if accepted.success() => {}
        Ok(accepted) => p.deviate(format!(
            "{} where the contract says 201: a key of exactly 255 characters",
            accepted.brief()
        )),
        Err(_) => {
            p.deviate("no answer where the contract says 201: a key of exactly 255 characters")
        }
    }
    Ok(())
}

fn ext_04(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let key = p.key("ext-04");
    let body = p.order_body("2", "9.99");
    let created = p.post(User::A, Some(&key), &body)?;
    let id = created_id(p, &created, "the first request")?;
    if created.header("Location").is_none() {
        p.deviate("the 201 has no Location");
    }
    for _ in 1..=2 {
        let Ok(replay) = p.post(User::A, Some(&key), &body) else {
            p.deviate(format!(
                "no answer where the contract says a 200 replay of order {id}: a retry"
            ));
            continue;
        };
        match p.id_in(&replay).filter(|_| replay.success()) {
            Some(other) if other != id => {
                p.expose(format!(
                    "a retry of the request that created order {id} was answered {} with another order {other}",
                    replay.status
                ));
                continue;
            }
            Some(_) => {}
            None => {
                p.deviate(format!(
                    "{} where the contract says a 200 replay of order {id}: a retry",
                    replay.brief()
                ));
                continue;
            }
        }
        if replay.status != 200 {
            p.deviate(format!(
                "{} where the contract says 200 (the retry created nothing): a retry",
                replay.status
            ));
        }
        if !replay.replayed() {
            p.deviate("a retry has no `Idempotent-Replayed: true`");
        }
        if replay.body != created.body {
            p.deviate(format!(
                "a retry's body differs from the first answer's: {}",
                replay.brief()
            ));
        }
        for header in ["Location", "Content-Type"] {
            if replay.header(header) != created.header(header) {
                p.deviate(format!(
                    "a retry's {header} is {}, the first answer had {}",
                    replay.header(header).unwrap_or("(none)"),
                    created.header(header).unwrap_or("(none)")
                ));
            }
        }
    }
    let orders = p.created(User::A)?;
    if orders.len() > 1 {
        p.expose(format!(
            "the retries of one request created {} orders: {}",
            orders.len(),
            orders.join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::without_occurrence;

    #[test]
    fn two_problems_that_differ_only_in_their_instance_say_the_same() {
        let a = r#"{"type":"/problems/not-found","status":404,"instance":"urn:request:a"}"#;
        let b = r#"{"type":"/problems/not-found","status":404,"instance":"urn:request:b"}"#;
        assert_eq!(without_occurrence(a), without_occurrence(b));
        let other = r#"{"type":"/problems/forbidden","status":404,"instance":"urn:request:a"}"#;
        assert_ne!(without_occurrence(a), without_occurrence(other));
    }

    #[test]
    fn a_body_without_an_instance_is_compared_as_it_is() {
        for body in ["not found", r#"{"b":1, "a":2}"#, "[1]", ""] {
            assert_eq!(without_occurrence(body), body);
        }
    }
}
