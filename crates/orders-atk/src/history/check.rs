//! The rules a history must keep, checked per (user, key) and per order:
//! each is cheap on its own, and together they are the contract's
//! "consistent" (docs/CONTRACT.md, History checking).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use serde_json::Value;

use super::canon::{canonical, id_text};
use super::event::{F, History, Malformed, Operation, Outcome};
use super::model::{self, Action, Fields, Op, Order, Seen, Timed};

/// Characters of one event shown in a counterexample.
const EVENT_CHARS: usize = 600;

/// One rule of a consistent history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    OneOrderPerKey,
    ExecutedAnswerReplayed,
    OtherRequestNeverOk,
    AcknowledgedCreateListedOnce,
    NoOrderWithoutKey,
    OrderLinearizable,
}

impl Rule {
    pub const ALL: [Rule; 6] = [
        Rule::OneOrderPerKey,
        Rule::ExecutedAnswerReplayed,
        Rule::OtherRequestNeverOk,
        Rule::AcknowledgedCreateListedOnce,
        Rule::NoOrderWithoutKey,
        Rule::OrderLinearizable,
    ];

    /// Its name in reports: `one-order-per-key`, ….
    pub fn id(self) -> &'static str {
        match self {
            Rule::OneOrderPerKey => "one-order-per-key",
            Rule::ExecutedAnswerReplayed => "executed-answer-replayed",
            Rule::OtherRequestNeverOk => "other-request-never-ok",
            Rule::AcknowledgedCreateListedOnce => "acknowledged-create-listed-once",
            Rule::NoOrderWithoutKey => "no-order-without-key",
            Rule::OrderLinearizable => "order-linearizable",
        }
    }

    /// What it asks, in one sentence.
    pub fn statement(self) -> &'static str {
        match self {
            Rule::OneOrderPerKey => {
                "at most one order exists for a (user, key) in the closing list"
            }
            Rule::ExecutedAnswerReplayed => {
                "every ok to the request that executed under a key carries the executed answer \
                 (the same body; 201 may come back 200)"
            }
            Rule::OtherRequestNeverOk => {
                "a request with another fingerprint than the one that executed is never ok for that key"
            }
            Rule::AcknowledgedCreateListedOnce => {
                "every ok create's order is in the closing list exactly once"
            }
            Rule::NoOrderWithoutKey => "no order exists for a key that was never sent",
            Rule::OrderLinearizable => {
                "the history of each order's state (create, updates, cancel, reads) is linearizable"
            }
        }
    }
}

/// One event of a counterexample: its line and what it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shown {
    pub line: usize,
    pub text: String,
}

/// A rule broken, where, and the fewest events that show it.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub rule: Rule,
    pub user: String,
    pub key: Option<String>,
    pub order: Option<String>,
    /// What is wrong, in a sentence or two.
    pub what: String,
    /// The counterexample, in the history's order.
    pub events: Vec<Shown>,
}

/// What the check found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Checked {
    pub events: usize,
    pub operations: usize,
    pub users: usize,
    pub keys: usize,
    pub orders: usize,
    /// Creates, updates and cancels answered ok.
    pub acknowledged: usize,
    pub violations: Vec<Violation>,
}

impl Checked {
    pub fn consistent(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of `rule`.
    pub fn of(&self, rule: Rule) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.rule == rule)
    }
}

/// What one key's requests came to.
struct KeyRun<'h> {
    user: &'h str,
    key: &'h str,
    attempts: Vec<usize>,
    /// The operations it may have executed: the request answered ok, or
    /// else each request whose outcome is unknown.
    executed: Vec<Logical>,
}

/// Every attempt of one request (one fingerprint) under one key, as one
/// operation: invoked when its first attempt that may have run was, and,
/// when one was answered ok, answered then.
#[derive(Clone)]
struct Logical {
    f: F,
    value: Value,
    invoked: usize,
    /// The first ok: its line, its body.
    ok: Option<(usize, Value)>,
    attempts: Vec<usize>,
}

/// Checks `history` against every rule.
pub fn check(history: &History) -> Result<Checked, Malformed> {
    let ops = &history.operations;
    let mut checked = Checked {
        events: history.events.len(),
        operations: ops.len(),
        acknowledged: ops
            .iter()
            .filter(|o| o.f.mutates() && matches!(o.outcome, Outcome::Ok { .. }))
            .count(),
        ..Checked::default()
    };
    let users: BTreeSet<&str> = ops.iter().map(|o| o.user.as_str()).collect();
    checked.users = users.len();

    // Per (user, key): rules 2 and 3, and what executed.
    let mut by_key: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if let Some(key) = &op.key {
            by_key.entry((&op.user, key)).or_default().push(i);
        }
    }
    checked.keys = by_key.len();
    let runs: Vec<KeyRun<'_>> = by_key
        .into_iter()
        .map(|((user, key), attempts)| key_run(history, user, key, attempts, &mut checked))
        .collect();

    for user in users {
        check_user(history, user, &runs, &mut checked)?;
    }
    checked.violations.sort_by(|a, b| {
        (a.events.first().map(|e| e.line), a.rule).cmp(&(b.events.first().map(|e| e.line), b.rule))
    });
    Ok(checked)
}

/// A request's fingerprint in a history: what it does and its value.
fn fingerprint(op: &Operation) -> String {
    format!("{} {}", op.f.name(), canonical(&op.value))
}

fn key_run<'h>(
    history: &'h History,
    user: &'h str,
    key: &'h str,
    attempts: Vec<usize>,
    checked: &mut Checked,
) -> KeyRun<'h> {
    let ops = &history.operations;
    let mut requests: Vec<(String, Logical)> = Vec::new();
    for &i in &attempts {
        let Some(op) = ops.get(i) else { continue };
        let print = fingerprint(op);
        let at = match requests.iter().position(|(p, _)| *p == print) {
            Some(at) => at,
            None => {
                requests.push((
                    print,
                    Logical {
                        f: op.f,
                        value: op.value.clone(),
                        invoked: usize::MAX,
                        ok: None,
                        attempts: Vec::new(),
                    },
                ));
                requests.len() - 1
            }
        };
        let Some((_, logical)) = requests.get_mut(at) else {
            continue;
        };
        logical.attempts.push(i);
        if op.outcome.may_have_run() {
            logical.invoked = logical.invoked.min(op.invoke);
        }
        if let Outcome::Ok { line, body, .. } = &op.outcome
            && logical.ok.as_ref().is_none_or(|(first, _)| line < first)
        {
            logical.ok = Some((*line, body.clone()));
        }
    }
    let answered: Vec<&Logical> = requests
        .iter()
        .map(|(_, l)| l)
        .filter(|l| l.ok.is_some())
        .collect();
    let violation = |rule, what: String, lines: Vec<usize>| Violation {
        rule,
        user: user.to_owned(),
        key: Some(key.to_owned()),
        order: None,
        what,
        events: show(history, lines, &BTreeSet::new()),
    };
    if answered.len() > 1 {
        let described: Vec<String> = answered
            .iter()
            .filter_map(|l| {
                let (line, _) = l.ok.as_ref()?;
                Some(format!(
                    "{} {} (ok on line {line})",
                    l.f.name(),
                    canonical(&l.value)
                ))
            })
            .collect();
        let lines = answered
            .iter()
            .flat_map(|l| first_ok_attempt(ops, l))
            .collect();
        checked.violations.push(violation(
            Rule::OtherRequestNeverOk,
            format!(
                "{} different requests were answered ok under this key: {}; a key executes one \
                 request, and refuses every other (a client told that a request which never ran \
                 succeeded)",
                answered.len(),
                described.join(", ")
            ),
            lines,
        ));
    } else if let Some(executed) = answered.first() {
        check_replays(history, executed, &violation, checked);
    }
    // With several answered, the first answered is taken as the one that
    // executed: the others are this rule's violation, not the order's.
    let executed = match answered
        .iter()
        .min_by_key(|l| l.ok.as_ref().map(|(line, _)| *line))
    {
        Some(first) => vec![(*first).clone()],
        None => requests
            .into_iter()
            .map(|(_, l)| l)
            .filter(|l| l.invoked != usize::MAX)
            .collect(),
    };
    KeyRun {
        user,
        key,
        attempts,
        executed,
    }
}

/// The invoke and ok lines of `logical`'s first acknowledged attempt.
fn first_ok_attempt(ops: &[Operation], logical: &Logical) -> Vec<usize> {
    let Some((ok_line, _)) = logical.ok else {
        return Vec::new();
    };
    logical
        .attempts
        .iter()
        .filter_map(|&i| ops.get(i))
        .find(|o| o.outcome.line() == Some(ok_line))
        .map(|o| vec![o.invoke, ok_line])
        .unwrap_or_default()
}

/// Rule 2: every ok of the executed request the same answer as its first.
fn check_replays(
    history: &History,
    executed: &Logical,
    violation: &dyn Fn(Rule, String, Vec<usize>) -> Violation,
    checked: &mut Checked,
) {
    let ops = &history.operations;
    let mut oks: Vec<(&Operation, u16, &Value)> = executed
        .attempts
        .iter()
        .filter_map(|&i| ops.get(i))
        .filter_map(|o| match &o.outcome {
            Outcome::Ok { status, body, .. } => Some((o, *status, body)),
            _ => None,
        })
        .collect();
    oks.sort_by_key(|(o, _, _)| o.outcome.line());
    let Some(&(first, first_status, first_body)) = oks.first() else {
        return;
    };
    let statuses_agree = |a: u16, b: u16| a == b || matches!((a, b), (200, 201) | (201, 200));
    for &(other, status, body) in oks.iter().skip(1) {
        let same_body = canonical(first_body) == canonical(body);
        if same_body && statuses_agree(first_status, status) {
            continue;
        }
        let differs = if same_body {
            format!("status {first_status} then {status}")
        } else {
            differing_members(first_body, body)
        };
        let lines = [
            first.invoke,
            first.outcome.line().unwrap_or(0),
            other.invoke,
        ]
        .into_iter()
        .chain(other.outcome.line())
        .collect();
        checked.violations.push(violation(
            Rule::ExecutedAnswerReplayed,
            format!(
                "the same request was answered ok twice with different answers ({differs}): a retry \
                 must get the executed answer, as it was"
            ),
            lines,
        ));
        return;
    }
}

/// `a` and `b` differ in: the members that differ, or "the body".
fn differing_members(a: &Value, b: &Value) -> String {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            let differ: Vec<String> = names
                .into_iter()
                .filter(|n| a.get(*n).map(canonical) != b.get(*n).map(canonical))
                .map(|n| {
                    let shown = |v: Option<&Value>| v.map_or("absent".into(), Value::to_string);
                    format!("{n}: {} then {}", shown(a.get(n)), shown(b.get(n)))
                })
                .collect();
            differ.join(", ")
        }
        _ => "the body".into(),
    }
}

/// What a user's operations show of each order, by id: the changes that
/// may have run (the executed request of each key), the reads, the lists.
struct Observations<'h> {
    changes: HashMap<String, Vec<(&'h KeyRun<'h>, &'h Logical)>>,
    reads: HashMap<String, Vec<&'h Operation>>,
    lists: Vec<(&'h Operation, HashMap<String, Value>)>,
}

/// An order of one user, and what the history shows of it.
#[derive(Default)]
struct OrderFacts<'h> {
    /// Creates attributed to it: by an ok answer naming it, or matched.
    creates: Vec<(&'h KeyRun<'h>, Logical)>,
    /// Its state before the history, from the opening listing.
    existed: Option<Value>,
}

fn check_user(
    history: &History,
    user: &str,
    runs: &[KeyRun<'_>],
    checked: &mut Checked,
) -> Result<(), Malformed> {
    let ops = &history.operations;
    let mine = |op: &&Operation| op.user == user;
    let lists: Vec<&Operation> = ops
        .iter()
        .filter(mine)
        .filter(|o| o.f == F::List && matches!(o.outcome, Outcome::Ok { .. }))
        .collect();
    let first_mutation = ops
        .iter()
        .filter(mine)
        .filter(|o| o.f.mutates())
        .map(|o| o.invoke)
        .min();
    let Some(first_mutation) = first_mutation else {
        // Only reads: nothing was sent under a key, and no order is this
        // history's; its reads are checked against what its lists showed.
        return Ok(());
    };
    let Some(closing) = lists.last().copied() else {
        return Err(Malformed {
            line: None,
            why: format!(
                "user {user:?} sent creates, updates or cancels, but the history has no ok list \
                 of their orders after the run (the closing list the checks compare with)"
            ),
        });
    };
    if closing.invoke < first_mutation {
        return Err(Malformed {
            line: Some(closing.invoke),
            why: format!(
                "the last ok list of user {user:?} was invoked before their first create, update \
                 or cancel (line {first_mutation}): a closing list is read after the run"
            ),
        });
    }
    let listed = |op: &Operation| -> Vec<Value> {
        match &op.outcome {
            Outcome::Ok {
                body: Value::Array(orders),
                ..
            } => orders.clone(),
            _ => Vec::new(),
        }
    };
    let opening = lists
        .first()
        .copied()
        .filter(|l| l.outcome.line().is_some_and(|done| done < first_mutation));
    let mut orders: BTreeMap<String, OrderFacts<'_>> = BTreeMap::new();
    if let Some(opening) = opening {
        for order in listed(opening) {
            if let Some(id) = order.get("id").map(id_text) {
                orders.entry(id).or_default().existed = Some(order);
            }
        }
    }
    let closing_orders = listed(closing);
    let closing_ids: Vec<String> = closing_orders
        .iter()
        .filter_map(|o| o.get("id").map(id_text))
        .collect();
    let closing_line = closing.outcome.line().unwrap_or(closing.invoke);

    // Orders named by acknowledged creates; rule 4 for each.
    let user_runs: Vec<&KeyRun<'_>> = runs.iter().filter(|r| r.user == user).collect();
    let mut unanswered: Vec<(&KeyRun<'_>, &Logical)> = Vec::new();
    // Acknowledged orders missing from the closing list: this rule's, so
    // the closing list's absence is left out of their linearizability.
    let mut lost: BTreeSet<String> = BTreeSet::new();
    for run in &user_runs {
        for logical in run.executed.iter().filter(|l| l.f == F::Create) {
            let Some((ok_line, body)) = &logical.ok else {
                unanswered.push((run, logical));
                continue;
            };
            let Some(id) = body.get("id").map(id_text) else {
                continue;
            };
            orders
                .entry(id.clone())
                .or_default()
                .creates
                .push((run, logical.clone()));
            if *ok_line > closing.invoke {
                continue;
            }
            let times = closing_ids.iter().filter(|listed| **listed == id).count();
            if times == 0 {
                lost.insert(id.clone());
            }
            if times != 1 {
                let said = if times == 0 {
                    "is not in it: an acknowledged order was lost".to_owned()
                } else {
                    format!("is in it {times} times")
                };
                let mut lines = first_ok_attempt(ops, logical);
                lines.extend([closing.invoke, closing_line]);
                checked.violations.push(Violation {
                    rule: Rule::AcknowledgedCreateListedOnce,
                    user: user.to_owned(),
                    key: Some(run.key.to_owned()),
                    order: Some(id.clone()),
                    what: format!(
                        "order {id}, created by the ok on line {ok_line}, {said} (the closing list, line {closing_line})"
                    ),
                    events: show(history, lines, &BTreeSet::from([id])),
                });
            }
        }
    }

    // Orders in the closing list that no ok create named: each must be
    // the work of one create whose outcome is unknown, a key each.
    let changed: BTreeSet<String> = ops
        .iter()
        .filter(mine)
        .filter(|o| matches!(o.f, F::Update | F::Cancel) && o.outcome.may_have_run())
        .filter_map(|o| o.target().map(id_text))
        .collect();
    let strangers: Vec<(&String, &Value)> = closing_ids
        .iter()
        .zip(&closing_orders)
        .filter(|(id, _)| !orders.contains_key(*id))
        .collect();
    unanswered.sort_by_key(|(_, l)| l.invoked);
    let could_make = |order: &Value, id: &str, logical: &Logical| {
        changed.contains(id) || body_matches(&logical.value, order)
    };
    let matched = match_orders(&strangers, &unanswered, could_make);
    for (s, (id, _)) in strangers.iter().enumerate() {
        if let Some(&Some(c)) = matched.get(s)
            && let Some((run, logical)) = unanswered.get(c)
        {
            orders
                .entry((*id).clone())
                .or_default()
                .creates
                .push((run, (*logical).clone()));
        }
    }
    for (s, (id, order)) in strangers.iter().enumerate() {
        if !matches!(matched.get(s), Some(Some(_))) {
            let violation = stranger(history, user, id, order, closing, &user_runs, &orders);
            checked.violations.push(violation);
        }
    }
    let strange: BTreeSet<&String> = strangers
        .iter()
        .enumerate()
        .filter(|(s, _)| !matches!(matched.get(*s), Some(Some(_))))
        .map(|(_, (id, _))| *id)
        .collect();

    // Every order the history names: its operations, linearizable.
    let mut named: BTreeSet<String> = orders.keys().cloned().collect();
    for op in ops.iter().filter(mine) {
        if let Some(id) = op.target() {
            named.insert(id_text(id));
        }
    }
    for list in &lists {
        named.extend(listed(list).iter().filter_map(|o| o.get("id").map(id_text)));
    }
    named.retain(|id| !strange.contains(id));
    checked.orders += named.len();
    let mut observations = Observations {
        changes: HashMap::new(),
        reads: HashMap::new(),
        lists: lists
            .iter()
            .map(|l| {
                let by_id = listed(l)
                    .into_iter()
                    .filter_map(|o| Some((id_text(o.get("id")?), o)))
                    .collect();
                (*l, by_id)
            })
            .collect(),
    };
    for run in &user_runs {
        for logical in run
            .executed
            .iter()
            .filter(|l| matches!(l.f, F::Update | F::Cancel))
        {
            if let Some(id) = logical.value.get("id").map(id_text) {
                observations
                    .changes
                    .entry(id)
                    .or_default()
                    .push((run, logical));
            }
        }
    }
    for op in ops.iter().filter(mine).filter(|o| o.f == F::Read) {
        if let Some(id) = op.target().map(id_text) {
            observations.reads.entry(id).or_default().push(op);
        }
    }
    for id in named {
        let facts = orders.remove(&id).unwrap_or_default();
        let unseen = lost.contains(&id).then_some(closing.invoke);
        if let Some(violation) = linearize(history, user, &id, &facts, &observations, unseen) {
            checked.violations.push(violation);
        }
    }
    Ok(())
}

/// Whether `order` has what `body` asked for: each member the same value.
fn body_matches(body: &Value, order: &Value) -> bool {
    body.as_object().is_some_and(|members| {
        members
            .iter()
            .all(|(name, value)| order.get(name).map(canonical) == Some(canonical(value)))
    })
}

/// A maximum matching of `orders` to the creates that `could` have made
/// them, a create at most one order (augmenting paths): for each order, the
/// index of its create, or `None`.
fn match_orders(
    orders: &[(&String, &Value)],
    creates: &[(&KeyRun<'_>, &Logical)],
    could: impl Fn(&Value, &str, &Logical) -> bool,
) -> Vec<Option<usize>> {
    let edges: Vec<Vec<usize>> = orders
        .iter()
        .map(|(id, order)| {
            (0..creates.len())
                .filter(|&c| creates.get(c).is_some_and(|(_, l)| could(order, id, l)))
                .collect()
        })
        .collect();
    let mut owner: Vec<Option<usize>> = vec![None; creates.len()];
    fn augment(
        o: usize,
        edges: &[Vec<usize>],
        owner: &mut [Option<usize>],
        seen: &mut [bool],
    ) -> bool {
        for &c in edges.get(o).map(Vec::as_slice).unwrap_or_default() {
            if seen.get(c).copied().unwrap_or(true) {
                continue;
            }
            if let Some(s) = seen.get_mut(c) {
                *s = true;
            }
            let current = owner.get(c).copied().flatten();
            if current.is_none_or(|other| augment(other, edges, owner, seen)) {
                if let Some(slot) = owner.get_mut(c) {
                    *slot = Some(o);
                }
                return true;
            }
        }
        false
    }
    for o in 0..orders.len() {
        let mut seen = vec![false; creates.len()];
        augment(o, &edges, &mut owner, &mut seen);
    }
    let mut matched = vec![None; orders.len()];
    for (c, o) in owner.iter().enumerate() {
        if let Some(slot) = o.and_then(|o| matched.get_mut(o)) {
            *slot = Some(c);
        }
    }
    matched
}

/// The violation for an order in the closing list that no create of this
/// history accounts for: a second order for a key whose body it has, or
/// an order for a key never sent.
fn stranger(
    history: &History,
    user: &str,
    id: &str,
    order: &Value,
    closing: &Operation,
    runs: &[&KeyRun<'_>],
    orders: &BTreeMap<String, OrderFacts<'_>>,
) -> Violation {
    let closing_lines = [
        closing.invoke,
        closing.outcome.line().unwrap_or(closing.invoke),
    ];
    // A key that sent this body and already has its order.
    let twin = orders.iter().find_map(|(other, facts)| {
        facts
            .creates
            .iter()
            .find(|(_, l)| body_matches(&l.value, order))
            .map(|(run, l)| (other, *run, l))
    });
    if let Some((other, run, logical)) = twin {
        let how = match &logical.ok {
            Some((line, _)) => format!("acknowledged on line {line}"),
            None => "whose create has no answer and accounts for it".into(),
        };
        let mut lines: Vec<usize> = run
            .attempts
            .iter()
            .filter_map(|&i| history.operations.get(i))
            .flat_map(|o| [o.invoke].into_iter().chain(o.outcome.line()))
            .collect();
        lines.extend(closing_lines);
        return Violation {
            rule: Rule::OneOrderPerKey,
            user: user.to_owned(),
            key: Some(run.key.to_owned()),
            order: Some(id.to_owned()),
            what: format!(
                "the closing list has two orders with the body sent under this key: {other} \
                 ({how}) and {id}, which no answer named: one key made two orders"
            ),
            events: show(
                history,
                lines,
                &BTreeSet::from([other.clone(), id.to_owned()]),
            ),
        };
    }
    let sent_by = runs.iter().find(|r| {
        r.executed.is_empty()
            && r.attempts.iter().any(|&i| {
                history
                    .operations
                    .get(i)
                    .is_some_and(|o| o.f == F::Create && body_matches(&o.value, order))
            })
    });
    let why = match sent_by {
        Some(run) => format!(
            "; its body was sent only under key {:?}, whose every attempt was refused",
            run.key
        ),
        None => "; no create of this history sent its body".into(),
    };
    Violation {
        rule: Rule::NoOrderWithoutKey,
        user: user.to_owned(),
        key: sent_by.map(|r| r.key.to_owned()),
        order: Some(id.to_owned()),
        what: format!(
            "order {id} is in the closing list, but no create that may have run accounts for it{why}"
        ),
        events: show(
            history,
            closing_lines.to_vec(),
            &BTreeSet::from([id.to_owned()]),
        ),
    }
}

/// Rule 6 for order `id`: its operations, and, when they cannot be
/// linearized, the smallest set of them that cannot.
fn linearize(
    history: &History,
    user: &str,
    id: &str,
    facts: &OrderFacts<'_>,
    seen_by: &Observations<'_>,
    // The list (by its invoke line) whose absence of the order is left out.
    unseen: Option<usize>,
) -> Option<Violation> {
    let ops = &history.operations;
    let changes = seen_by
        .changes
        .get(id)
        .map(Vec::as_slice)
        .unwrap_or_default();
    // The members the model follows: those the requests set.
    let mut tracked: BTreeSet<String> = BTreeSet::new();
    for (_, logical) in &facts.creates {
        tracked.extend(members(&logical.value));
    }
    for (_, logical) in changes {
        tracked.extend(members(logical.value.get("body").unwrap_or(&Value::Null)));
    }
    let seen = |order: &Value| Seen {
        fields: project(order, &tracked),
        status: order
            .get("status")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let outcome = |logical: &Logical| match &logical.ok {
        Some((_, body)) if body.is_object() => model::Outcome::Seen(seen(body)),
        Some(_) => model::Outcome::Done,
        None => model::Outcome::Unknown,
    };
    // Each timed operation, with the lines that show it.
    let mut timed: Vec<(Timed, Vec<usize>)> = Vec::new();
    let logical_lines = |logical: &Logical| -> Vec<usize> {
        match logical.ok {
            Some(_) => first_ok_attempt(ops, logical),
            None => logical
                .attempts
                .iter()
                .filter_map(|&i| ops.get(i))
                .filter(|o| o.outcome.may_have_run())
                .flat_map(|o| [o.invoke].into_iter().chain(o.outcome.line()))
                .collect(),
        }
    };
    if let Some(existed) = &facts.existed {
        let order = Order {
            fields: project(existed, &tracked),
            cancelled: existed.get("status").and_then(Value::as_str) == Some("cancelled"),
        };
        timed.push((
            Timed {
                op: Op {
                    action: Action::Existed(order),
                    outcome: model::Outcome::Done,
                },
                invoked: 0,
                answered: Some(0),
            },
            Vec::new(),
        ));
    }
    let mut key = None;
    for (run, logical) in &facts.creates {
        key.get_or_insert_with(|| run.key.to_owned());
        timed.push((
            Timed {
                op: Op {
                    action: Action::Create(project(&logical.value, &tracked)),
                    outcome: outcome(logical),
                },
                invoked: logical.invoked,
                answered: logical.ok.as_ref().map(|(line, _)| *line),
            },
            logical_lines(logical),
        ));
    }
    for (_, logical) in changes {
        let action = match logical.f {
            F::Update => Action::Update(project(
                logical.value.get("body").unwrap_or(&Value::Null),
                &tracked,
            )),
            _ => Action::Cancel,
        };
        timed.push((
            Timed {
                op: Op {
                    action,
                    outcome: outcome(logical),
                },
                invoked: logical.invoked,
                answered: logical.ok.as_ref().map(|(line, _)| *line),
            },
            logical_lines(logical),
        ));
    }
    for op in seen_by.reads.get(id).map(Vec::as_slice).unwrap_or_default() {
        let (action, outcome, line) = match &op.outcome {
            Outcome::Ok { line, body, .. } => {
                (Action::Read, model::Outcome::Seen(seen(body)), *line)
            }
            Outcome::Fail {
                line,
                status: Some(404),
            } => (Action::ReadAbsent, model::Outcome::Done, *line),
            _ => continue,
        };
        timed.push((
            Timed {
                op: Op { action, outcome },
                invoked: op.invoke,
                answered: Some(line),
            },
            vec![op.invoke, line],
        ));
    }
    for (list, by_id) in &seen_by.lists {
        if unseen == Some(list.invoke) && !by_id.contains_key(id) {
            continue;
        }
        let line = list.outcome.line().unwrap_or(list.invoke);
        let (action, outcome) = match by_id.get(id) {
            Some(order) => (Action::Read, model::Outcome::Seen(seen(order))),
            None => (Action::ReadAbsent, model::Outcome::Done),
        };
        timed.push((
            Timed {
                op: Op { action, outcome },
                invoked: list.invoke,
                answered: Some(line),
            },
            vec![list.invoke, line],
        ));
    }
    let all: Vec<&Timed> = timed.iter().map(|(t, _)| t).collect();
    if model::linearizable(&all) {
        return None;
    }
    let just: Vec<Timed> = timed.iter().map(|(t, _)| t.clone()).collect();
    let kept = model::minimal(&just);
    let lines: Vec<usize> = kept
        .iter()
        .filter_map(|&i| timed.get(i))
        .flat_map(|(_, lines)| lines.iter().copied())
        .collect();
    Some(Violation {
        rule: Rule::OrderLinearizable,
        user: user.to_owned(),
        key,
        order: Some(id.to_owned()),
        what: format!(
            "no order of these {} operations on order {id}, each taking effect between its \
             invocation and its answer, explains what they answered (of its {} operations, \
             only these are needed to show it)",
            kept.len(),
            timed.len()
        ),
        events: show(history, lines, &BTreeSet::from([id.to_owned()])),
    })
}

fn members(body: &Value) -> Vec<String> {
    body.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// `order`'s members named in `tracked`, as canonical text.
fn project(order: &Value, tracked: &BTreeSet<String>) -> Fields {
    tracked
        .iter()
        .filter_map(|name| Some((name.clone(), canonical(order.get(name)?))))
        .collect()
}

/// The events on `lines` (each once, in order), lists cut to the orders in `focus`.
fn show(history: &History, mut lines: Vec<usize>, focus: &BTreeSet<String>) -> Vec<Shown> {
    lines.sort_unstable();
    lines.dedup();
    lines
        .into_iter()
        .filter_map(|line| {
            let (text, event) = history.line(line)?;
            let text = match (&event.value, event.f) {
                (Value::Object(value), F::List)
                    if value.get("body").is_some_and(Value::is_array) =>
                {
                    let all = value
                        .get("body")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    let kept: Vec<Value> = value
                        .get("body")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter(|o| {
                            o.get("id")
                                .map(id_text)
                                .is_some_and(|id| focus.contains(&id))
                        })
                        .cloned()
                        .collect();
                    let mut cut = event.clone();
                    let shown = kept.len();
                    if let Value::Object(v) = &mut cut.value {
                        v.insert("body".into(), Value::Array(kept));
                    }
                    format!("{}   ({shown} of its {all} orders shown)", cut.to_line())
                }
                _ => text.to_owned(),
            };
            Some(Shown {
                line,
                text: crate::probe::trim(&text, EVENT_CHARS),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::history::parse;

    /// A history written line by line, as a recorder would.
    #[derive(Default)]
    struct Writer {
        lines: Vec<String>,
        time: u64,
    }

    impl Writer {
        fn event(
            &mut self,
            process: u64,
            kind: &str,
            f: &str,
            key: Option<&str>,
            value: Value,
        ) -> &mut Self {
            self.time += 1;
            self.lines.push(
                json!({"process": process, "type": kind, "f": f, "user": "alice", "key": key, "value": value, "time": self.time})
                    .to_string(),
            );
            self
        }

        fn invoke(&mut self, p: u64, f: &str, key: Option<&str>, value: Value) -> &mut Self {
            self.event(p, "invoke", f, key, value)
        }

        fn ok(
            &mut self,
            p: u64,
            f: &str,
            key: Option<&str>,
            status: u16,
            body: Value,
        ) -> &mut Self {
            self.event(p, "ok", f, key, json!({"status": status, "body": body}))
        }

        fn fail(&mut self, p: u64, f: &str, key: Option<&str>, status: u16) -> &mut Self {
            self.event(
                p,
                "fail",
                f,
                key,
                json!({"status": status, "body": {"error": "refused"}}),
            )
        }

        fn info(&mut self, p: u64, f: &str, key: Option<&str>) -> &mut Self {
            self.event(p, "info", f, key, json!({"error": "no answer"}))
        }

        /// A whole create: invoke and ok with `order`.
        fn created(
            &mut self,
            p: u64,
            key: &str,
            body: Value,
            status: u16,
            order: Value,
        ) -> &mut Self {
            self.invoke(p, "create", Some(key), body)
                .ok(p, "create", Some(key), status, order)
        }

        /// The list at `line`'s place: `orders`.
        fn list(&mut self, orders: Value) -> &mut Self {
            self.invoke(99, "list", None, Value::Null)
                .ok(99, "list", None, 200, orders)
        }

        fn check(&self) -> Checked {
            let text = self.lines.join("\n");
            check(&parse(&text).unwrap()).unwrap()
        }
    }

    fn body(quantity: u64) -> Value {
        json!({"item": "pen", "quantity": quantity, "price": 3.5})
    }

    fn order(id: &str, quantity: u64, status: &str) -> Value {
        json!({"id": id, "item": "pen", "quantity": quantity, "price": 3.5, "status": status, "created_at": "2026-01-01T00:00:00Z"})
    }

    /// The rules the history broke, each with its key.
    fn broken(checked: &Checked) -> Vec<(Rule, Option<String>)> {
        checked
            .violations
            .iter()
            .map(|v| (v.rule, v.key.clone()))
            .collect()
    }

    fn consistent(checked: &Checked) {
        assert!(checked.consistent(), "{:#?}", checked.violations);
    }

    #[test]
    fn a_retry_that_made_a_second_order_breaks_one_order_per_key_and_its_replaying_twin_does_not() {
        let mut h = Writer::default();
        h.invoke(1, "create", Some("k1"), body(2))
            .info(1, "create", Some("k1"));
        // The retry's key was lost on the way: the server made a second order.
        h.created(1, "k1", body(2), 201, order("o2", 2, "pending"));
        h.list(json!([
            order("o2", 2, "pending"),
            order("o1", 2, "pending")
        ]));
        let checked = h.check();
        assert_eq!(
            broken(&checked),
            vec![(Rule::OneOrderPerKey, Some("k1".into()))]
        );
        let violation = &checked.violations[0];
        assert_eq!(violation.order.as_deref(), Some("o1"));
        assert!(
            violation.what.contains("one key made two orders"),
            "{}",
            violation.what
        );
        let lines: Vec<usize> = violation.events.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![1, 2, 3, 4, 5, 6]);
        assert!(
            violation.events[5]
                .text
                .contains("(2 of its 2 orders shown)"),
            "{:?}",
            violation.events
        );

        let mut twin = Writer::default();
        twin.invoke(1, "create", Some("k1"), body(2))
            .info(1, "create", Some("k1"));
        twin.created(1, "k1", body(2), 200, order("o1", 2, "pending"));
        twin.list(json!([order("o1", 2, "pending")]));
        consistent(&twin.check());
    }

    #[test]
    fn an_order_of_a_create_whose_answer_was_lost_is_accounted_for_by_its_key() {
        let mut h = Writer::default();
        h.invoke(1, "create", Some("k1"), body(2))
            .info(1, "create", Some("k1"));
        h.invoke(2, "create", Some("k2"), body(2)); // never completed
        h.list(json!([
            order("o1", 2, "pending"),
            order("o2", 2, "pending")
        ]));
        let checked = h.check();
        consistent(&checked);
        assert_eq!(checked.orders, 2);
        // A third order with that body has no key left to account for it.
        let mut three = Writer::default();
        three
            .invoke(1, "create", Some("k1"), body(2))
            .info(1, "create", Some("k1"));
        three.invoke(2, "create", Some("k2"), body(2));
        three.list(json!([
            order("o1", 2, "pending"),
            order("o2", 2, "pending"),
            order("o3", 2, "pending")
        ]));
        let checked = three.check();
        assert_eq!(checked.violations.len(), 1, "{:#?}", checked.violations);
        assert_eq!(checked.violations[0].rule, Rule::OneOrderPerKey);
    }

    #[test]
    fn a_replay_with_another_answer_breaks_the_executed_answer_rule_and_a_byte_identical_one_does_not()
     {
        let mut h = Writer::default();
        h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        h.created(1, "k1", body(2), 200, order("o1", 3, "pending"));
        h.list(json!([order("o1", 2, "pending")]));
        let checked = h.check();
        assert!(
            broken(&checked).contains(&(Rule::ExecutedAnswerReplayed, Some("k1".into()))),
            "{:#?}",
            checked.violations
        );
        let violation = checked.of(Rule::ExecutedAnswerReplayed).next().unwrap();
        assert!(
            violation.what.contains("quantity: 2 then 3"),
            "{}",
            violation.what
        );
        assert_eq!(
            violation.events.iter().map(|e| e.line).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );

        let mut twin = Writer::default();
        twin.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        // The same request, its members in another order and the price spelled otherwise.
        twin.created(
            2,
            "k1",
            json!({"price": 3.50, "quantity": 2, "item": "pen"}),
            200,
            order("o1", 2, "pending"),
        );
        twin.list(json!([order("o1", 2, "pending")]));
        consistent(&twin.check());
    }

    #[test]
    fn another_body_answered_ok_under_a_used_key_breaks_the_other_request_rule_and_a_refusal_does_not()
     {
        let mut h = Writer::default();
        h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        h.created(2, "k1", body(99), 201, order("o1", 2, "pending"));
        h.list(json!([order("o1", 2, "pending")]));
        let checked = h.check();
        assert!(
            broken(&checked).contains(&(Rule::OtherRequestNeverOk, Some("k1".into()))),
            "{:#?}",
            checked.violations
        );
        let violation = checked.of(Rule::OtherRequestNeverOk).next().unwrap();
        assert_eq!(
            violation.events.iter().map(|e| e.line).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );

        let mut twin = Writer::default();
        twin.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        twin.invoke(2, "create", Some("k1"), body(99))
            .fail(2, "create", Some("k1"), 409);
        twin.list(json!([order("o1", 2, "pending")]));
        consistent(&twin.check());
    }

    #[test]
    fn an_acknowledged_order_missing_from_the_closing_list_or_listed_twice_breaks_its_rule() {
        let mut lost = Writer::default();
        lost.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        lost.list(json!([]));
        let checked = lost.check();
        assert!(
            broken(&checked).contains(&(Rule::AcknowledgedCreateListedOnce, Some("k1".into()))),
            "{:#?}",
            checked.violations
        );
        let violation = checked
            .of(Rule::AcknowledgedCreateListedOnce)
            .next()
            .unwrap();
        assert!(
            violation.what.contains("an acknowledged order was lost"),
            "{}",
            violation.what
        );

        let mut twice = Writer::default();
        twice.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        twice.list(json!([
            order("o1", 2, "pending"),
            order("o1", 2, "pending")
        ]));
        let checked = twice.check();
        assert!(
            checked
                .of(Rule::AcknowledgedCreateListedOnce)
                .next()
                .unwrap()
                .what
                .contains("is in it 2 times")
        );

        let mut twin = Writer::default();
        twin.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        twin.list(json!([order("o1", 2, "pending")]));
        consistent(&twin.check());
    }

    #[test]
    fn an_order_no_sent_key_accounts_for_breaks_the_no_order_without_key_rule() {
        let mut h = Writer::default();
        h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        // Its create was refused (422): it changed nothing.
        h.invoke(2, "create", Some("k2"), body(7))
            .fail(2, "create", Some("k2"), 422);
        h.list(json!([
            order("o1", 2, "pending"),
            order("o7", 7, "pending"),
            order("o8", 8, "pending")
        ]));
        let checked = h.check();
        let strangers: Vec<(Option<String>, Option<String>)> = checked
            .of(Rule::NoOrderWithoutKey)
            .map(|v| (v.key.clone(), v.order.clone()))
            .collect();
        assert_eq!(
            strangers,
            vec![
                (Some("k2".into()), Some("o7".into())),
                (None, Some("o8".into()))
            ],
            "{:#?}",
            checked.violations
        );
        assert_eq!(checked.violations.len(), 2);

        let mut twin = Writer::default();
        twin.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        twin.invoke(2, "create", Some("k2"), body(7))
            .info(2, "create", Some("k2"));
        twin.list(json!([
            order("o1", 2, "pending"),
            order("o7", 7, "pending")
        ]));
        consistent(&twin.check());
    }

    #[test]
    fn orders_listed_before_the_first_change_existed_before_the_history_and_need_no_key() {
        let mut h = Writer::default();
        h.list(json!([order("old", 1, "cancelled")]));
        h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        h.list(json!([
            order("o1", 2, "pending"),
            order("old", 1, "cancelled")
        ]));
        consistent(&h.check());

        // Without the opening list, the old order is nobody's.
        let mut bare = Writer::default();
        bare.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        bare.list(json!([
            order("o1", 2, "pending"),
            order("old", 1, "cancelled")
        ]));
        assert_eq!(broken(&bare.check()), vec![(Rule::NoOrderWithoutKey, None)]);
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_update_is_not_linearizable_and_one_during_it_is() {
        let update = |h: &mut Writer, p: u64| {
            h.invoke(
                p,
                "update",
                Some("k2"),
                json!({"id": "o1", "body": {"quantity": 5}}),
            );
        };
        let mut h = Writer::default();
        h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        update(&mut h, 1);
        h.ok(1, "update", Some("k2"), 200, order("o1", 5, "pending"));
        h.invoke(2, "read", None, json!({"id": "o1"})).ok(
            2,
            "read",
            None,
            200,
            order("o1", 2, "pending"),
        );
        h.list(json!([order("o1", 5, "pending")]));
        let checked = h.check();
        assert_eq!(
            broken(&checked),
            vec![(Rule::OrderLinearizable, Some("k1".into()))],
            "{:#?}",
            checked.violations
        );
        let violation = &checked.violations[0];
        assert_eq!(violation.order.as_deref(), Some("o1"));
        // The create, the update, the stale read: not the closing list.
        assert_eq!(
            violation.events.iter().map(|e| e.line).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5, 6]
        );

        let mut twin = Writer::default();
        twin.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        update(&mut twin, 1);
        twin.invoke(2, "read", None, json!({"id": "o1"})).ok(
            2,
            "read",
            None,
            200,
            order("o1", 2, "pending"),
        );
        twin.ok(1, "update", Some("k2"), 200, order("o1", 5, "pending"));
        twin.list(json!([order("o1", 5, "pending")]));
        consistent(&twin.check());
    }

    #[test]
    fn an_update_acknowledged_after_a_cancel_is_not_linearizable_and_its_refusal_is() {
        let mut h = Writer::default();
        h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        h.invoke(1, "cancel", Some("k2"), json!({"id": "o1"})).ok(
            1,
            "cancel",
            Some("k2"),
            200,
            order("o1", 2, "cancelled"),
        );
        h.invoke(
            1,
            "update",
            Some("k3"),
            json!({"id": "o1", "body": {"quantity": 4}}),
        );
        let mut twin = Writer {
            lines: h.lines.clone(),
            time: h.time,
        };
        h.ok(1, "update", Some("k3"), 200, order("o1", 4, "pending"));
        h.list(json!([order("o1", 4, "pending")]));
        assert_eq!(
            broken(&h.check()),
            vec![(Rule::OrderLinearizable, Some("k1".into()))]
        );

        twin.fail(1, "update", Some("k3"), 409);
        twin.list(json!([order("o1", 2, "cancelled")]));
        consistent(&twin.check());
    }

    #[test]
    fn an_update_whose_answer_was_lost_may_show_in_the_closing_list_or_not() {
        for quantity in [2, 6] {
            let mut h = Writer::default();
            h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
            h.invoke(
                1,
                "update",
                Some("k2"),
                json!({"id": "o1", "body": {"quantity": 6}}),
            )
            .info(1, "update", Some("k2"));
            h.list(json!([order("o1", quantity, "pending")]));
            consistent(&h.check());
        }
    }

    #[test]
    fn a_user_who_changed_orders_without_a_closing_list_makes_the_history_malformed() {
        let mut h = Writer::default();
        h.created(1, "k1", body(2), 201, order("o1", 2, "pending"));
        let text = h.lines.join("\n");
        let malformed = check(&parse(&text).unwrap()).unwrap_err();
        assert_eq!(malformed.line, None);
        assert!(malformed.why.contains("no ok list"), "{malformed}");
    }

    #[test]
    fn an_event_in_a_counterexample_is_cut_to_six_hundred_characters() {
        let long = json!({"item": "p".repeat(2000), "quantity": 2, "price": 3.5});
        let mut h = Writer::default();
        h.created(
            1,
            "k1",
            long.clone(),
            201,
            json!({"id": "o1", "item": "p".repeat(2000), "quantity": 2, "price": 3.5}),
        );
        h.list(json!([]));
        let checked = h.check();
        let violation = checked
            .of(Rule::AcknowledgedCreateListedOnce)
            .next()
            .unwrap();
        let first = &violation.events[0].text;
        assert!(first.contains(r#""type":"invoke""#), "{first}");
        assert!(
            first.chars().count() < EVENT_CHARS + 30,
            "{}",
            first.chars().count()
        );
        assert!(first.ends_with(" characters)"), "{first}");
    }

    #[test]
    fn the_same_key_of_two_users_is_two_keys() {
        let text = [
            r#"{"process": 1, "type": "invoke", "f": "create", "user": "alice", "key": "k", "value": {"item": "pen", "quantity": 2, "price": 1}, "time": 1}"#,
            r#"{"process": 1, "type": "ok", "f": "create", "user": "alice", "key": "k", "value": {"status": 201, "body": {"id": "a1", "item": "pen", "quantity": 2, "price": 1}}, "time": 2}"#,
            r#"{"process": 2, "type": "invoke", "f": "create", "user": "bob", "key": "k", "value": {"item": "cup", "quantity": 1, "price": 1}, "time": 3}"#,
            r#"{"process": 2, "type": "ok", "f": "create", "user": "bob", "key": "k", "value": {"status": 201, "body": {"id": "b1", "item": "cup", "quantity": 1, "price": 1}}, "time": 4}"#,
            r#"{"process": 3, "type": "invoke", "f": "list", "user": "alice", "key": null, "value": null, "time": 5}"#,
            r#"{"process": 3, "type": "ok", "f": "list", "user": "alice", "key": null, "value": {"status": 200, "body": [{"id": "a1", "item": "pen", "quantity": 2, "price": 1}]}, "time": 6}"#,
            r#"{"process": 3, "type": "invoke", "f": "list", "user": "bob", "key": null, "value": null, "time": 7}"#,
            r#"{"process": 3, "type": "ok", "f": "list", "user": "bob", "key": null, "value": {"status": 200, "body": [{"id": "b1", "item": "cup", "quantity": 1, "price": 1}]}, "time": 8}"#,
        ]
        .join("\n");
        let checked = check(&parse(&text).unwrap()).unwrap();
        consistent(&checked);
        assert_eq!(
            (
                checked.users,
                checked.keys,
                checked.orders,
                checked.acknowledged
            ),
            (2, 2, 2, 2)
        );
    }
}
