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
    /// The routes besides `POST` it tries, of [`crate::shape::ROUTES`]: it
    /// is skipped on a target that lacks every one of them.
    pub tries: &'static [&'static str],
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
        tries: &[],
        check: atk_01,
    },
    Attack {
        id: "ATK-02",
        title: "empty or whitespace-only key",
        sends: "a valid order with the keys \"\", \" \", \"   \", \"\\t\", \" \\t \"",
        expects: "400 for each; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_02,
    },
    Attack {
        id: "ATK-03",
        title: "replay a key with a changed body",
        sends: "an order (quantity 2, price 9.99), then under its key: quantity 99 and price 0.01; the numbers as strings; a member added; price left out; price null; then the same body reordered and with whitespace",
        expects: "201; 409 for quantity 99 (409 or 422 for the others); a 200 replay for the same body written otherwise; the original order unchanged; no second order",
        exposed_if: "a changed body is answered 2xx (the first order replayed for a different request), the original order changes, or a second order appears",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_03,
    },
    Attack {
        id: "ATK-04",
        title: "two different keys",
        sends: "the same order twice, each with its own key",
        expects: "two 201s with two different orders (by design)",
        exposed_if: "the second key is answered with the first key's order (two keys collide)",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_04,
    },
    Attack {
        id: "ATK-05",
        title: "concurrent requests with one key",
        sends: "--concurrency identical POSTs with one key, released together (3 rounds)",
        expects: "one 201 and one order per round; every other answer a 200 replay of that order or a 409 in progress; no 5xx",
        exposed_if: "a round creates more than one order",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_05,
    },
    Attack {
        id: "ATK-06",
        title: "negative quantity",
        sends: "quantity -1 and -1000000",
        expects: "422; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_06,
    },
    Attack {
        id: "ATK-07",
        title: "zero quantity",
        sends: "quantity 0",
        expects: "422; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_07,
    },
    Attack {
        id: "ATK-08",
        title: "missing required fields",
        sends: "an order without item, without quantity, without price, and {}",
        expects: "422 for each; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_08,
    },
    Attack {
        id: "ATK-09",
        title: "cross-origin browser POST",
        sends: "form, multipart and text/plain POSTs from a foreign Origin, a CORS preflight, a JSON POST from that Origin",
        expects: "415 for non-JSON bodies and nothing created by them; no Access-Control-Allow-* for the foreign origin",
        exposed_if: "a non-JSON POST creates an order, or an answer grants the foreign origin access",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_09,
    },
    Attack {
        id: "ATK-10",
        title: "negative price",
        sends: "price -0.01 and -9.99",
        expects: "422; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_10,
    },
    Attack {
        id: "ATK-11",
        title: "quantity as a string, float or other non-integer",
        sends: "quantity \"1\", 1.5, 1.0, 1e2, true, null",
        expects: "422 for each; no order created",
        exposed_if: "an order is created",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_11,
    },
    Attack {
        id: "ATK-12",
        title: "SQL injection in the key",
        sends: "keys such as '; DROP TABLE orders; -- , each sent twice",
        expects: "an opaque key: 201, then a 200 replay of the same order; one order per key; listing still works",
        exposed_if: "a retry creates a second order, or the orders created before the injection are gone",
        needs: Needs::OneUser,
        tries: &[],
        check: atk_12,
    },
    Attack {
        id: "EXT-01",
        title: "another user's key (tenancy)",
        sends: "user A and user B each POST the same order with the same key",
        expects: "two unrelated keys: B gets its own 201 and its own order, not A's replay",
        exposed_if: "user B is answered with user A's order, or the key creates a second order",
        needs: Needs::TwoUsers,
        tries: &[],
        check: ext_01,
    },
    Attack {
        id: "EXT-02",
        title: "another user's order (tenancy)",
        sends: "user B reads, changes and cancels user A's order, and a nonexistent one",
        expects: "404 exactly like a nonexistent order; A's order unchanged and absent from B's list",
        exposed_if: "user B reads, changes or cancels user A's order, or sees it in its list",
        needs: Needs::TwoUsers,
        tries: &["GET", "PATCH", "DELETE"],
        check: ext_02,
    },
    Attack {
        id: "EXT-03",
        title: "key over 255 characters",
        sends: "keys of 255 and 256 characters; past an accepted 256, keys of 8 KiB and 64 KiB, each retried; the bound found by bisection",
        expects: "201 for 255; 400 and nothing created for 256",
        exposed_if: "keys of 8 KiB and 64 KiB are both accepted and replayed (no bound), a long key's retry creates another order, or a refused key creates one",
        needs: Needs::OneUser,
        tries: &[],
        check: ext_03,
    },
    Attack {
        id: "EXT-04",
        title: "replay header preservation",
        sends: "an order, then the same request twice",
        expects: "each retry: 200, Idempotent-Replayed: true, the same body, Location and Content-Type",
        exposed_if: "a retry creates an order, or answers with a different order",
        needs: Needs::OneUser,
        tries: &[],
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

/// [`refusals`] of requests the application, not an idempotency layer,
/// must answer (each under a key of its own): those the layer answered
/// instead are one deviation that says so, and are not judged as refusals.
fn application_refusals(p: &mut Probe<'_>, answers: &[(String, Option<Response>)], want: u16) {
    let (layer, application): (Vec<_>, Vec<_>) = answers
        .iter()
        .cloned()
        .partition(|(_, r)| r.as_ref().is_some_and(|r| p.layer_answer(r).is_some()));
    if let Some((_, Some(first))) = layer.first() {
        let whats: Vec<&str> = layer.iter().map(|(w, _)| w.as_str()).collect();
        let why = p.layer_answer(first).unwrap_or_default();
        p.deviate(format!(
            "answered by the idempotency layer, not the application ({why}: {}), although \
             each had a key of its own, so what the application does with them is unknown: {}",
            first.brief(),
            whats.join(", ")
        ));
    }
    refusals(p, &application, want);
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

/// A retry (`what`) of the request that created order `id`, answered
/// without an order: where it is refused (4xx), the client is told that a
/// request which created an order failed. A deviation: the contract replays
/// it, and the order exists once, so the attack achieved nothing.
fn retry_not_replayed(p: &mut Probe<'_>, id: &str, what: &str, answer: &Response) {
    if (400..500).contains(&answer.status) {
        p.deviate(format!(
            "{what} of the request that created order {id} was refused ({}) where the contract \
             says a 200 replay: a client would think the order it created failed, and may send \
             it again under a new key",
            answer.brief()
        ));
    } else {
        p.deviate(format!(
            "{} where the contract says a 200 replay of order {id}: {what}",
            answer.brief()
        ));
    }
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
    let now = if p.shape().has("GET") {
        let read = p.get_order(user, id)?;
        if !read.success() {
            return Err(CannotJudge(format!(
                "reading the original order {id} back answered {}",
                read.brief()
            )));
        }
        p.order_in(&read).unwrap_or_default()
    } else {
        // No way to read one order: its line in the listing.
        let shape = p.shape().clone();
        p.run_orders(user)?
            .into_iter()
            .find(|o| shape.id_of(o).as_deref() == Some(id))
            .ok_or_else(|| CannotJudge(format!("the listing no longer shows order {id}")))?
    };
    let then = order_facts(p, &p.order_in(expected).unwrap_or_default());
    let now = order_facts(p, &now);
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

/// ATK-03's bodies for the key of `{"quantity": 2, "price": 9.99}` that are
/// other requests, each with what it is: a changed value, and what a loose
/// comparison takes for the first.
fn other_requests(p: &Probe<'_>) -> Vec<(String, String, u16)> {
    let shape = p.shape();
    let item = p.target.item();
    let (q, pr) = (&shape.quantity_field, &shape.price_field);
    let added = p.order_body("2", "9.99");
    let added = format!(
        "{},\"atk_note\":\"a member the first request did not have\"}}",
        added.trim_end_matches('}')
    );
    vec![
        // The contract's own: a valid body, another order: 409.
        (
            format!("the changed body ({q} 99, {pr} 0.01) with the same key"),
            p.order_body("99", "0.01"),
            409,
        ),
        // What a loose comparison misses: refused (409, or 422 where
        // validation comes first), never the first order.
        (
            format!("the numbers sent as strings ({q} \"2\", {pr} \"9.99\") with the same key"),
            p.order_body("\"2\"", "\"9.99\""),
            0,
        ),
        (
            "the body with a member added (atk_note) with the same key".to_owned(),
            added,
            0,
        ),
        (
            format!("the body without {pr} with the same key"),
            shape.body(Some(&item), Some("2"), None),
            0,
        ),
        (
            format!("the body with {pr} null with the same key"),
            p.order_body("2", "null"),
            0,
        ),
    ]
}

/// ATK-03's bodies that are the first request written otherwise: the same
/// request, which the contract replays.
fn same_requests(p: &Probe<'_>) -> Vec<(String, String)> {
    let shape = p.shape();
    let json = |t: &str| serde_json::Value::String(t.to_owned()).to_string();
    let mut members = vec![
        format!("{}:{}", json(&shape.item_field), json(&p.target.item())),
        format!("{}:2", json(&shape.quantity_field)),
        format!("{}:9.99", json(&shape.price_field)),
    ];
    members.extend(
        shape
            .extra
            .iter()
            .map(|(name, value)| format!("{}:{value}", json(name))),
    );
    let spaced = format!(
        "{{\n  {}\n}}\n",
        members.join(",\n  ").replace("\":", "\" : ")
    );
    members.reverse();
    vec![
        (
            "the same body with its members reordered".to_owned(),
            format!("{{{}}}", members.join(",")),
        ),
        ("the same body with whitespace added".to_owned(), spaced),
    ]
}

fn atk_03(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let key = p.key("03");
    let body = p.order_body("2", "9.99");
    let first = p.post(User::A, Some(&key), &body)?;
    let id = created_id(p, &first, "the first request")?;

    let mut refused = Vec::new();
    for (changed, body, want) in other_requests(p) {
        let answer = p.post(User::A, Some(&key), &body).ok();
        let Some(tampered) = answer else {
            refused.push((changed, None, want));
            continue;
        };
        if !tampered.success() {
            if want != 0 || tampered.status >= 500 {
                refused.push((changed, Some(tampered), want.max(409)));
            }
            continue;
        }
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
    }
    for (changed, answer, want) in refused {
        refusals(p, &[(changed, answer)], want);
    }
    for (same, body) in same_requests(p) {
        match p.post(User::A, Some(&key), &body) {
            Ok(r) if r.success() => match p.id_in(&r) {
                Some(other) if other != id => p.expose(format!(
                    "{same} was answered {} with another order {other}: one request, two orders",
                    r.status
                )),
                _ => {}
            },
            Ok(r) => p.deviate(format!(
                "{} where the contract says a 200 replay of order {id}: {same} is the same \
                 request (the contract compares canonical JSON; this target compares bytes)",
                r.brief()
            )),
            Err(_) => p.deviate(format!(
                "no answer where the contract says a 200 replay of order {id}: {same}"
            )),
        }
    }
    expect_unchanged(p, User::A, &id, &first, "the changed bodies")?;
    more_than_one_created(p, "one key and its changed bodies")
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
        Some(_) if p.replayed(second) => {
            p.deviate(format!(
                "the second key's answer is marked as a replay ({})",
                p.shape().replay_header
            ));
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
    let mut raced = 0;
    for round in 1..=RACE_ROUNDS {
        let key = p.key(&format!("05-round-{round}"));
        let race = p.race(User::A, &key, &body, count);
        if race.overlapped {
            raced += 1;
        }
        let sent = race.answers.len();
        let responses: Vec<Response> = race.answers.into_iter().filter_map(Result::ok).collect();
        let unanswered = sent - responses.len();
        if unanswered > 0 {
            p.deviate(format!(
                "round {round}: {unanswered} of {sent} concurrent duplicates got no answer where \
                 the contract says a 201, a replay or 409 in progress"
            ));
        }
        // What the round made is in the state, answered or not.
        let created = p.created(User::A)?;
        let this_round: Vec<String> = created
            .iter()
            .filter(|id| !before.contains(id))
            .cloned()
            .collect();
        judge_race(
            p,
            round,
            &responses,
            unanswered,
            race.overlapped,
            &this_round,
        );
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
    if raced == 0 {
        return Err(CannotJudge(format!(
            "no race was tried: in each of {RACE_ROUNDS} rounds every one of the {count} \
             requests was answered before the next was sent (--concurrency {count}), so no two \
             were ever in flight at once; one order per round shows nothing about concurrent \
             duplicates"
        )));
    }
    Ok(())
}

/// One round of identical concurrent requests, as far as they were answered,
/// and the orders the round made (by the state): this contract answers one
/// 201 and replays it (200, marked by the replay header) or says 409 in
/// progress to the others; anything else is a deviation. Creations are
/// counted by the state; of the unmarked 2xx answers naming a new order, one
/// per order is its creation's answer, the others replays without the
/// replay header.
fn judge_race(
    p: &mut Probe<'_>,
    round: usize,
    responses: &[Response],
    unanswered: usize,
    overlapped: bool,
    made: &[String],
) {
    let header = p.shape().replay_header.clone();
    let replays: Vec<&Response> = responses
        .iter()
        .filter(|r| r.success() && p.replayed(r))
        .collect();
    // Unmarked 2xx answers: the first answer naming each new order (a 201
    // first) is its creation's; the others returned it again.
    let mut unmarked: Vec<&Response> = responses
        .iter()
        .filter(|r| r.success() && !p.replayed(r))
        .collect();
    unmarked.sort_by_key(|r| r.status != 201);
    let (mut creations, mut unmarked_replays, mut unknown) = (Vec::new(), Vec::new(), 0);
    for r in unmarked {
        match p.id_in(r) {
            Some(id) if creations.contains(&id) => unmarked_replays.push(id),
            Some(id) if made.contains(&id) => creations.push(id),
            _ => unknown += 1,
        }
    }
    let in_progress = responses.iter().filter(|r| r.status == 409).count();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for r in responses {
        *statuses.entry(r.status).or_default() += 1;
    }
    let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{n}×{s}")).collect();
    let overlap = if overlapped {
        "the requests overlapped"
    } else {
        "no race was tried: each request was answered before the next was sent"
    };
    p.note(format!(
        "round {round}: {} requests made {} new order(s) (by the state); answers: {} creation, \
         {} replayed, {} replayed without `{header}`, {unknown} unmarked 2xx naming no new order, \
         {in_progress} in progress (409), {} other, {unanswered} without an answer ({}); {overlap}",
        responses.len() + unanswered,
        made.len(),
        creations.len(),
        replays.len(),
        unmarked_replays.len(),
        responses.len()
            - creations.len()
            - replays.len()
            - unmarked_replays.len()
            - unknown
            - in_progress,
        statuses.join(", ")
    ));
    if !unmarked_replays.is_empty() {
        let mut orders = unmarked_replays.clone();
        orders.sort();
        orders.dedup();
        p.deviate(format!(
            "round {round}: {} concurrent duplicates returned order {} again without `{header}: true`: replays \
             without the replay header, which a client cannot tell from creations (the contract \
             says 200 with `{header}: true`)",
            unmarked_replays.len(),
            orders.join(", ")
        ));
    }
    if creations.len() + unknown > 1 {
        p.deviate(format!(
            "{} concurrent duplicates were answered as creations (2xx without `{header}: true`, \
             each naming another order) where the contract says one 201 and replays (200 with \
             `{header}: true`)",
            creations.len() + unknown
        ));
    }
    let replayed_201 = replays.iter().filter(|r| r.status != 200).count();
    if replayed_201 > 0 {
        p.deviate(format!(
            "{replayed_201} replays of the race were answered {} where the contract says 200 \
             (the retry created nothing)",
            replays
                .iter()
                .find(|r| r.status != 200)
                .map_or(0, |r| r.status)
        ));
    }
    if let Some(blank) = responses
        .iter()
        .find(|r| r.success() && p.id_in(r).is_none())
    {
        p.deviate(format!(
            "a concurrent duplicate was answered {} without the order",
            blank.brief()
        ));
    }
    if let Some(other) = responses.iter().find(|r| !r.success() && r.status != 409) {
        p.deviate(format!(
            "a concurrent duplicate was answered {} where the contract says a replay or 409 in progress",
            other.brief()
        ));
    }
}

/// Sends each body (with what it is), each with a fresh key of its own
/// (`<suffix>-1`, `<suffix>-2`, …), so that an idempotency layer in front
/// of the application has no earlier answer to give for it; this contract
/// refuses each with `status` and creates nothing. When the layer answered
/// every body anyway, the application was never asked: the check cannot
/// judge.
fn refused_each(
    p: &mut Probe<'_>,
    suffix: &str,
    bodies: &[(String, String)],
    status: u16,
) -> Result<(), CannotJudge> {
    let mut answers = Vec::new();
    for (n, (what, body)) in bodies.iter().enumerate() {
        let key = p.key(&format!("{suffix}-{}", n + 1));
        let response = p.post(User::A, Some(&key), body).ok();
        answers.push((what.clone(), response));
    }
    application_refusals(p, &answers, status);
    let what: Vec<&str> = bodies.iter().map(|(w, _)| w.as_str()).collect();
    created_by_each(p, &answers, &what)?;
    let by_layer = answers
        .iter()
        .filter(|(_, r)| r.as_ref().is_some_and(|r| p.layer_answer(r).is_some()))
        .count();
    if by_layer == answers.len() {
        return Err(CannotJudge(format!(
            "every body was answered by the idempotency layer, not the application \
             (see the deviation): {}",
            what.join(", ")
        )));
    }
    Ok(())
}

/// Exposed when the bodies sent (each under a key of its own, with its
/// answer) created orders: each order is laid to the body whose answer
/// named it; one that no answer named is listed as such, with every body.
fn created_by_each(
    p: &mut Probe<'_>,
    answers: &[(String, Option<Response>)],
    every: &[&str],
) -> Result<(), CannotJudge> {
    let created = p.created(User::A)?;
    if created.is_empty() {
        return Ok(());
    }
    let mut laid = Vec::new();
    let mut named = Vec::new();
    for (what, response) in answers {
        let id = response
            .as_ref()
            .filter(|r| r.success())
            .and_then(|r| p.id_in(r))
            .filter(|id| created.contains(id));
        if let Some(id) = id {
            laid.push(format!("{what} created order {id}"));
            named.push(id);
        }
    }
    let unnamed: Vec<&str> = created
        .iter()
        .filter(|id| !named.contains(id))
        .map(String::as_str)
        .collect();
    if !unnamed.is_empty() {
        laid.push(format!(
            "order(s) {} appeared that no answer named (the bodies sent: {})",
            unnamed.join(", "),
            every.join(", ")
        ));
    }
    p.expose(laid.join("; "));
    Ok(())
}

fn atk_06(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let bodies = [
        ("quantity -1".into(), p.order_body("-1", "9.99")),
        ("quantity -1000000".into(), p.order_body("-1000000", "9.99")),
    ];
    refused_each(p, "06", &bodies, 422)
}

fn atk_07(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let bodies = [("quantity 0".into(), p.order_body("0", "9.99"))];
    refused_each(p, "07", &bodies, 422)
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
    refused_each(p, "08", &bodies, 422)
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
    for (n, content_type) in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("{key}-{}", n + 1);
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
    application_refusals(p, &answers, 415);
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
    refused_each(p, "10", &bodies, 422)
}

/// The quantities ATK-11 sends: none is a JSON integer literal.
pub const NON_INTEGER_QUANTITIES: &[&str] = &[r#""1""#, "1.5", "1.0", "1e2", "true", "null"];

fn atk_11(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let bodies: Vec<(String, String)> = NON_INTEGER_QUANTITIES
        .iter()
        .map(|q| (format!("quantity {q}"), p.order_body(q, "9.99")))
        .collect();
    refused_each(p, "11", &bodies, 422)
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
            None => retry_not_replayed(p, &id, &format!("the retry with the key {key:?}"), &retry),
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
    // Only what A's requests made: on a target that lists every order,
    // A's listing shows B's order too (named by B's answer, not A's).
    let (mine, bobs) = (p.named(User::A), p.named(User::B));
    let created: Vec<String> = p
        .created(User::A)?
        .into_iter()
        .filter(|id| mine.contains(id) || !bobs.contains(id))
        .collect();
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
        Some(_) if p.replayed(bobs) => {
            p.deviate(format!(
                "user B's answer is marked as a replay ({})",
                p.shape().replay_header
            ));
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
        None => retry_not_replayed(p, a, "user A's retry", again),
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
    let (methods, lacked): (Vec<&str>, Vec<&str>) = ["GET", "PATCH", "DELETE"]
        .into_iter()
        .partition(|m| shape.has(m));
    if !lacked.is_empty() {
        p.note(format!(
            "user B's {} not tried: the profile says the target lacks {}",
            lacked.join(", "),
            lacked.join(", ")
        ));
    }
    for method in methods {
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

/// Key lengths EXT-03 sends past 256 to tell "no bound" from "another
/// bound": 8 KiB and 64 KiB (past many HTTP servers' header limits, which
/// are a bound too).
pub const LONG_KEYS: [usize; 2] = [8 * 1024, 64 * 1024];

/// A key of this run of exactly `length` characters (at least its prefix's).
fn key_of_length(p: &Probe<'_>, n: usize, length: usize) -> String {
    let prefix = p.key(&format!("ext-03-{n}-"));
    let pad = length.saturating_sub(prefix.len());
    format!("{prefix}{}", "k".repeat(pad))
}

/// What a key of some length met: accepted (an order named), or refused
/// (the answer, if any).
enum KeyAnswer {
    Accepted { id: String, status: u16 },
    Refused(Option<Response>),
}

/// EXT-03's probes: each key fresh, each length sent once (its retry too
/// when accepted past 256).
struct KeyProbe {
    sent: usize,
    /// Orders named by accepted keys.
    accepted: Vec<String>,
}

impl KeyProbe {
    fn send(&mut self, p: &mut Probe<'_>, length: usize) -> (String, KeyAnswer) {
        self.sent += 1;
        let key = key_of_length(p, self.sent, length);
        let body = p.order_body("2", "9.99");
        let answer = match p.post(User::A, Some(&key), &body) {
            Ok(r) => match p.id_in(&r).filter(|_| r.success()) {
                Some(id) => {
                    self.accepted.push(id.clone());
                    KeyAnswer::Accepted {
                        id,
                        status: r.status,
                    }
                }
                None => KeyAnswer::Refused(Some(r)),
            },
            Err(_) => KeyAnswer::Refused(None),
        };
        (key, answer)
    }

    /// The longest accepted length between `accepted` and `refused`, by
    /// bisection.
    fn bound(&mut self, p: &mut Probe<'_>, mut accepted: usize, mut refused: usize) -> usize {
        while refused - accepted > 1 {
            let mid = accepted + (refused - accepted) / 2;
            match self.send(p, mid).1 {
                KeyAnswer::Accepted { .. } => accepted = mid,
                KeyAnswer::Refused(_) => refused = mid,
            }
        }
        accepted
    }
}

fn ext_03(p: &mut Probe<'_>) -> Result<(), CannotJudge> {
    let mut probe = KeyProbe {
        sent: 0,
        accepted: Vec::new(),
    };
    let shortest = p.key("ext-03-0-").len();
    let (_, at_255) = probe.send(p, 255);
    let (_, at_256) = probe.send(p, 256);
    match (at_255, at_256) {
        (KeyAnswer::Accepted { .. }, KeyAnswer::Refused(refused)) => {
            // The contract's bound: 256 is refused as a bad request.
            refusals(p, &[("a key of 256 characters".to_owned(), refused)], 400);
        }
        (KeyAnswer::Refused(refused), KeyAnswer::Refused(_)) => {
            let shown = |r: Option<Response>| r.map_or_else(|| "nothing".to_owned(), |r| r.brief());
            match probe.send(p, shortest) {
                (_, KeyAnswer::Refused(also)) => p.deviate(format!(
                    "keys of 255, 256 and even {shortest} characters (the shortest this check \
                     sends) were refused where the contract accepts up to 255; a key of 255 \
                     characters was answered {}, one of {shortest} {}",
                    shown(refused),
                    shown(also)
                )),
                (_, KeyAnswer::Accepted { .. }) => {
                    let bound = probe.bound(p, shortest, 255);
                    p.deviate(format!(
                        "keys are bounded at {bound} characters where the contract says 255 \
                         ({bound} accepted, {} refused; a key of 255 characters was answered {})",
                        bound + 1,
                        shown(refused)
                    ));
                }
            }
        }
        (_, KeyAnswer::Accepted { id, status }) => {
            p.note(format!(
                "a key of 256 characters was accepted ({status} with order {id}): \
                 trying keys of {} and {} characters",
                LONG_KEYS[0], LONG_KEYS[1]
            ));
            long_keys(p, &mut probe)?;
        }
    }
    // A refused key that created an order anyway: by the state.
    let created: Vec<String> = p
        .created(User::A)?
        .into_iter()
        .filter(|id| !probe.accepted.contains(id))
        .collect();
    if !created.is_empty() {
        p.expose(format!(
            "a key the target refused created order {} anyway",
            created.join(", ")
        ));
    }
    Ok(())
}

/// EXT-03 past 256: keys of [`LONG_KEYS`] accepted and replayed mean no
/// bound (exposed); the first refused one is a bound, found by bisection (a
/// deviation naming it); an accepted one whose retry is not its replay
/// means keys that long are taken and not honoured (exposed).
fn long_keys(p: &mut Probe<'_>, probe: &mut KeyProbe) -> Result<(), CannotJudge> {
    let mut longest_accepted = 256;
    for length in LONG_KEYS {
        let (key, answer) = probe.send(p, length);
        let KeyAnswer::Accepted { id, .. } = answer else {
            let bound = probe.bound(p, longest_accepted, length);
            let how = match answer {
                KeyAnswer::Refused(Some(r)) => format!("was answered {}", r.brief()),
                _ => "got no answer".to_owned(),
            };
            p.deviate(format!(
                "keys are bounded at {bound} characters where the contract says 255 \
                 ({bound} accepted, {} refused; a key of {length} characters {how})",
                bound + 1
            ));
            return Ok(());
        };
        let body = p.order_body("2", "9.99");
        let retry = p.post(User::A, Some(&key), &body).ok();
        match retry
            .as_ref()
            .and_then(|r| p.id_in(r).filter(|_| r.success()))
        {
            Some(same) if same == id => {}
            Some(other) => {
                p.expose(format!(
                    "a key of {length} characters was accepted (order {id}), and its retry \
                     created another order {other}: keys that long are taken and not honoured"
                ));
                return Ok(());
            }
            None => {
                p.deviate(format!(
                    "a key of {length} characters was accepted (order {id}), and its retry \
                     was answered {} where the contract says a key that long is refused",
                    retry.map_or_else(|| "nothing".to_owned(), |r| r.brief())
                ));
                return Ok(());
            }
        }
        longest_accepted = length;
    }
    p.expose(format!(
        "keys have no bound: the target accepted and replayed 8 KiB and 64 KiB keys ({} and {} \
         characters; each retry answered the first order), where the contract refuses keys over \
         255 (whether it keeps the key or only a digest of it is not visible over HTTP)",
        LONG_KEYS[0], LONG_KEYS[1]
    ));
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
                retry_not_replayed(p, &id, "the retry", &replay);
                continue;
            }
        }
        if replay.status != 200 {
            p.deviate(format!(
                "{} where the contract says 200 (the retry created nothing): a retry",
                replay.status
            ));
        }
        if !p.replayed(&replay) {
            p.deviate(format!(
                "a retry has no `{}: true`",
                p.shape().replay_header
            ));
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
