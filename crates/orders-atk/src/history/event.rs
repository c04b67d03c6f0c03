//! A history as written: JSON Lines in Jepsen's shape, one event a line, in
//! the order observed; read strictly (a malformed line is named with its
//! number and what is wrong with it), then paired into operations: each
//! `invoke` with the completion its process sent next.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

/// Who sent an event: a client, by number or by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(untagged)]
pub enum Process {
    Number(u64),
    Name(String),
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Number(n) => write!(f, "{n}"),
            Process::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// An event's `type`: an operation's start, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Type {
    Invoke,
    /// A 2xx.
    Ok,
    /// An answer after which the attempt changed nothing.
    Fail,
    /// The outcome is unknown: no answer, a timeout, a 408, a 5xx.
    Info,
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum F {
    /// `POST /v1/orders`; the invoke's value is the body.
    Create,
    /// `PATCH /v1/orders/{id}`; `{"id": …, "body": {…}}`.
    Update,
    /// `DELETE /v1/orders/{id}`; `{"id": …}`.
    Cancel,
    /// `GET /v1/orders/{id}`; `{"id": …}`.
    Read,
    /// Every order of the user; the ok's body is the array of orders.
    List,
}

impl F {
    pub fn name(self) -> &'static str {
        match self {
            F::Create => "create",
            F::Update => "update",
            F::Cancel => "cancel",
            F::Read => "read",
            F::List => "list",
        }
    }

    /// Create, update or cancel: sent with an `Idempotency-Key`.
    pub fn mutates(self) -> bool {
        matches!(self, F::Create | F::Update | F::Cancel)
    }
}

/// One line of a history.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub process: Process,
    #[serde(rename = "type")]
    pub kind: Type,
    pub f: F,
    pub user: String,
    /// The `Idempotency-Key` sent; `None` for reads and lists.
    pub key: Option<String>,
    pub value: Value,
    /// Nanoseconds since the epoch.
    pub time: u64,
}

impl Event {
    /// The event as one line of JSON, without its newline.
    pub fn to_line(&self) -> String {
        // Plain data: serializing it cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Why a history cannot be checked: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// 1-based; `None` when the history as a whole lacks something.
    pub line: Option<usize>,
    pub why: String,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.why),
            None => write!(f, "{}", self.why),
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A 2xx: its status and body.
    Ok {
        line: usize,
        status: u16,
        body: Value,
    },
    /// Answered, and by the contract nothing changed.
    Fail { line: usize, status: Option<u16> },
    /// Unknown: `info` at `line`, or no completion at all (`None`).
    Info { line: Option<usize> },
}

impl Outcome {
    /// Not `fail`: the attempt may have changed something.
    pub fn may_have_run(&self) -> bool {
        !matches!(self, Outcome::Fail { .. })
    }

    /// The line of its completion, if it has one.
    pub fn line(&self) -> Option<usize> {
        match self {
            Outcome::Ok { line, .. } | Outcome::Fail { line, .. } => Some(*line),
            Outcome::Info { line } => *line,
        }
    }
}

/// One attempt: an `invoke` and its completion.
#[derive(Debug, Clone)]
pub struct Operation {
    pub process: Process,
    pub f: F,
    pub user: String,
    pub key: Option<String>,
    /// The invoke's value: the request.
    pub value: Value,
    pub invoke: usize,
    pub outcome: Outcome,
}

impl Operation {
    /// The order id the request names (update, cancel, read).
    pub fn target(&self) -> Option<&Value> {
        self.value.get("id")
    }
}

/// A parsed history: every line as written (for counterexamples), its
/// events, and its operations in the order they were invoked.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Each event with its 1-based line number and the line's text.
    pub events: Vec<(usize, String, Event)>,
    pub operations: Vec<Operation>,
}

impl History {
    /// The event on line `line`, with its text.
    pub fn line(&self, line: usize) -> Option<(&str, &Event)> {
        self.events
            .binary_search_by_key(&line, |(n, _, _)| *n)
            .ok()
            .and_then(|i| self.events.get(i))
            .map(|(_, text, event)| (text.as_str(), event))
    }
}

/// Reads a whole history: every non-blank line one event.
pub fn parse(text: &str) -> Result<History, Malformed> {
    parse_lines(text.lines().enumerate().map(|(i, l)| (i + 1, l)))
}

/// Reads the events `lines` (each with its 1-based number; blank lines are
/// skipped) and pairs them into operations. An invoke never completed is
/// an operation of unknown outcome.
pub fn parse_lines<'a>(
    lines: impl IntoIterator<Item = (usize, &'a str)>,
) -> Result<History, Malformed> {
    let mut history = History::default();
    // Each process's outstanding invoke: its operation's index.
    let mut outstanding: HashMap<Process, usize> = HashMap::new();
    for (number, text) in lines {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        let at = |why: String| Malformed {
            line: Some(number),
            why,
        };
        let event = read_event(trimmed).map_err(at)?;
        match event.kind {
            Type::Invoke => {
                if let Some(&open) = outstanding.get(&event.process) {
                    let first = history.operations.get(open).map_or(0, |o| o.invoke);
                    return Err(at(format!(
                        "process {} invokes again while its invoke on line {first} is outstanding \
                         (a process has one operation outstanding at a time)",
                        event.process
                    )));
                }
                check_invoke_value(&event).map_err(at)?;
                outstanding.insert(event.process.clone(), history.operations.len());
                history.operations.push(Operation {
                    process: event.process.clone(),
                    f: event.f,
                    user: event.user.clone(),
                    key: event.key.clone(),
                    value: event.value.clone(),
                    invoke: number,
                    outcome: Outcome::Info { line: None },
                });
            }
            kind => {
                let Some(open) = outstanding.remove(&event.process) else {
                    return Err(at(format!(
                        "a completion ({}) of process {}, which has no outstanding invoke",
                        type_name(kind),
                        event.process
                    )));
                };
                let Some(operation) = history.operations.get_mut(open) else {
                    return Err(at("internal: a lost operation".into()));
                };
                if (operation.f, &operation.user, &operation.key)
                    != (event.f, &event.user, &event.key)
                {
                    return Err(at(format!(
                        "this completion ({} {} of user {:?}, key {:?}) does not match process {}'s \
                         invoke on line {} ({} of user {:?}, key {:?}): f, user and key must repeat",
                        type_name(kind),
                        event.f.name(),
                        event.user,
                        event.key,
                        event.process,
                        operation.invoke,
                        operation.f.name(),
                        operation.user,
                        operation.key
                    )));
                }
                operation.outcome = completion(kind, &event, number).map_err(at)?;
            }
        }
        history.events.push((number, trimmed.to_owned(), event));
    }
    Ok(history)
}

fn type_name(kind: Type) -> &'static str {
    match kind {
        Type::Invoke => "invoke",
        Type::Ok => "ok",
        Type::Fail => "fail",
        Type::Info => "info",
    }
}

/// One line as an event: every member present and of its type; other
/// members (a tool's own) are allowed and ignored.
fn read_event(line: &str) -> Result<Event, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not a JSON value: {e}"))?;
    let Value::Object(event) = value else {
        return Err("an event is a JSON object".into());
    };
    let member = |name: &str| event.get(name).ok_or_else(|| format!("no `{name}` member"));
    let process =
        match member("process")? {
            Value::Number(n) => Process::Number(n.as_u64().ok_or_else(|| {
                format!("`process` must be a whole number ≥ 0 or a string, not {n}")
            })?),
            Value::String(s) => Process::Name(s.clone()),
            other => {
                return Err(format!(
                    "`process` must be a number or a string, not {other}"
                ));
            }
        };
    let kind = match member("type")?.as_str() {
        Some("invoke") => Type::Invoke,
        Some("ok") => Type::Ok,
        Some("fail") => Type::Fail,
        Some("info") => Type::Info,
        _ => {
            return Err(format!(
                "`type` must be \"invoke\", \"ok\", \"fail\" or \"info\", not {}",
                member("type")?
            ));
        }
    };
    let f = match member("f")?.as_str() {
        Some("create") => F::Create,
        Some("update") => F::Update,
        Some("cancel") => F::Cancel,
        Some("read") => F::Read,
        Some("list") => F::List,
        _ => {
            return Err(format!(
                "`f` must be \"create\", \"update\", \"cancel\", \"read\" or \"list\", not {}",
                member("f")?
            ));
        }
    };
    let user = match member("user")? {
        Value::String(s) => s.clone(),
        other => return Err(format!("`user` must be a string, not {other}")),
    };
    let key = match (event.get("key"), f.mutates()) {
        (Some(Value::String(k)), true) => Some(k.clone()),
        (None | Some(Value::Null), false) => None,
        (Some(other), true) => {
            return Err(format!(
                "`key` of a {} must be the Idempotency-Key sent (a string), not {other}",
                f.name()
            ));
        }
        (None, true) => return Err(format!("no `key` member (a {} sends one)", f.name())),
        (Some(other), false) => {
            return Err(format!(
                "`key` of a {} must be null (it sends no Idempotency-Key), not {other}",
                f.name()
            ));
        }
    };
    let value = event.get("value").cloned().unwrap_or(Value::Null);
    let time = match member("time")? {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("`time` must be whole nanoseconds ≥ 0, not {n}"))?,
        other => {
            return Err(format!(
                "`time` must be a number of nanoseconds, not {other}"
            ));
        }
    };
    Ok(Event {
        process,
        kind,
        f,
        user,
        key,
        value,
        time,
    })
}

/// An order id: a string or a number.
fn check_id(value: &Value, what: &str) -> Result<(), String> {
    match value.get("id") {
        Some(Value::String(_) | Value::Number(_)) => Ok(()),
        Some(other) => Err(format!(
            "{what}'s `id` must be a string or a number, not {other}"
        )),
        None => Err(format!("{what} has no `id`")),
    }
}

fn check_invoke_value(event: &Event) -> Result<(), String> {
    let value = &event.value;
    match event.f {
        F::Create if value.is_object() => Ok(()),
        F::Create => Err("a create's `value` is the request body, a JSON object".into()),
        F::Update => {
            check_id(value, "an update's `value`")?;
            match value.get("body") {
                Some(Value::Object(_)) => Ok(()),
                _ => Err("an update's `value` is {\"id\": …, \"body\": {…}}".into()),
            }
        }
        F::Cancel | F::Read => check_id(value, &format!("a {}'s `value`", event.f.name())),
        F::List => Ok(()),
    }
}

/// A completion's value, read for what it says.
fn completion(kind: Type, event: &Event, line: usize) -> Result<Outcome, String> {
    let status = |value: &Map<String, Value>| -> Result<Option<u16>, String> {
        match value.get("status") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (100..=599).contains(s))
                .map(Some)
                .ok_or_else(|| format!("`status` must be an HTTP status, not {n}")),
            Some(other) => Err(format!("`status` must be an HTTP status, not {other}")),
        }
    };
    match kind {
        Type::Ok => {
            let Value::Object(value) = &event.value else {
                return Err("an ok's `value` is {\"status\": …, \"body\": …}".into());
            };
            let status = status(value)?.ok_or("an ok's `value` has no `status`")?;
            if !(200..300).contains(&status) {
                return Err(format!(
                    "an ok is a 2xx answer, not {status} (a refusal is a fail, an unknown outcome an info)"
                ));
            }
            let body = value.get("body").cloned().unwrap_or(Value::Null);
            match event.f {
                F::Create | F::Read => {
                    check_id(&body, &format!("an ok {}'s body", event.f.name()))?
                }
                F::Update | F::Cancel if !body.is_null() => {
                    check_id(&body, &format!("an ok {}'s body", event.f.name()))?;
                }
                F::List => {
                    let Value::Array(orders) = &body else {
                        return Err("an ok list's body is the array of the user's orders".into());
                    };
                    for (i, order) in orders.iter().enumerate() {
                        check_id(order, &format!("order {} of the list", i + 1))?;
                    }
                }
                F::Update | F::Cancel => {}
            }
            Ok(Outcome::Ok { line, status, body })
        }
        Type::Fail => {
            let status = match &event.value {
                Value::Object(value) => status(value)?,
                _ => None,
            };
            if status.is_some_and(|s| (200..300).contains(&s)) {
                return Err("a fail is a refusal; a 2xx is an ok".into());
            }
            Ok(Outcome::Fail { line, status })
        }
        Type::Info => Ok(Outcome::Info { line: Some(line) }),
        Type::Invoke => Err("internal: an invoke is no completion".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATE: &str = r#"{"process": 3, "type": "invoke", "f": "create", "user": "alice", "key": "k-17", "value": {"item": "pen", "quantity": 2, "price": 3.5}, "time": 1733110000000000000}"#;
    const CREATED: &str = r#"{"process": 3, "type": "ok", "f": "create", "user": "alice", "key": "k-17", "value": {"status": 201, "body": {"id": "o-1", "item": "pen", "quantity": 2, "price": 3.5, "status": "pending"}}, "time": 1733110000004000000}"#;

    fn why(text: &str) -> Malformed {
        parse(text).unwrap_err()
    }

    #[test]
    fn the_contract_s_example_reads_as_one_acknowledged_create() {
        let history = parse(&format!("{CREATE}\n{CREATED}\n")).unwrap();
        assert_eq!(history.events.len(), 2);
        let [op] = history.operations.as_slice() else {
            panic!("{history:?}")
        };
        assert_eq!(
            (op.f, op.invoke, op.key.as_deref()),
            (F::Create, 1, Some("k-17"))
        );
        assert!(matches!(
            op.outcome,
            Outcome::Ok {
                line: 2,
                status: 201,
                ..
            }
        ));
        let (text, event) = history.line(2).unwrap();
        assert_eq!(text, CREATED);
        assert_eq!(event.kind, Type::Ok);
    }

    #[test]
    fn an_event_written_by_the_recorder_reads_back_as_the_same_event() {
        let history = parse(CREATE).unwrap();
        let (_, _, event) = &history.events[0];
        let again = parse(&event.to_line()).unwrap();
        assert_eq!(again.events[0].2.to_line(), event.to_line());
        assert!(event.to_line().starts_with(
            r#"{"process":3,"type":"invoke","f":"create","user":"alice","key":"k-17","#
        ));
    }

    #[test]
    fn an_invoke_never_completed_is_an_operation_of_unknown_outcome_and_blank_lines_are_skipped() {
        let history = parse(&format!("\n{CREATE}\n\n")).unwrap();
        assert!(matches!(
            history.operations[0].outcome,
            Outcome::Info { line: None }
        ));
        assert_eq!(history.operations[0].invoke, 2);
    }

    #[test]
    fn each_malformed_line_is_named_with_its_number_and_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("{", "not a JSON value"),
            ("[]", "an event is a JSON object"),
            (
                &CREATE.replace(r#""process": 3"#, r#""process": -1"#),
                "`process` must be a whole number",
            ),
            (
                &CREATE.replace(r#""process": 3"#, r#""process": true"#),
                "`process` must be a number or a string",
            ),
            (
                &CREATE.replace(r#""type": "invoke""#, r#""type": "okay""#),
                "`type` must be",
            ),
            (
                &CREATE.replace(r#""f": "create""#, r#""f": "delete""#),
                "`f` must be",
            ),
            (
                &CREATE.replace(r#""user": "alice""#, r#""user": 7"#),
                "`user` must be a string",
            ),
            (
                &CREATE.replace(r#""key": "k-17""#, r#""key": null"#),
                "`key` of a create must be",
            ),
            (
                &CREATE.replace(r#", "time": 1733110000000000000"#, ""),
                "no `time` member",
            ),
            (
                &CREATE.replace("1733110000000000000", "1.5"),
                "`time` must be whole nanoseconds",
            ),
            (
                &CREATE.replace(r#"{"item": "pen", "quantity": 2, "price": 3.5}"#, "[]"),
                "a create's `value` is the request body",
            ),
            (
                r#"{"process": 1, "type": "invoke", "f": "read", "user": "a", "key": "k", "value": {"id": "o"}, "time": 1}"#,
                "`key` of a read must be null",
            ),
            (
                r#"{"process": 1, "type": "invoke", "f": "update", "user": "a", "key": "k", "value": {"id": "o"}, "time": 1}"#,
                "an update's `value` is",
            ),
            (
                r#"{"process": 1, "type": "invoke", "f": "cancel", "user": "a", "key": "k", "value": {"id": [1]}, "time": 1}"#,
                "`id` must be a string or a number",
            ),
        ];
        for (line, expected) in cases {
            let malformed = why(&format!("{CREATE}\n{CREATED}\n{line}"));
            assert_eq!(malformed.line, Some(3), "{line}");
            assert!(
                malformed.why.contains(expected),
                "{line}: {}",
                malformed.why
            );
        }
    }

    #[test]
    fn a_completion_must_follow_its_own_invoke_and_say_what_it_completes() {
        let orphan = why(CREATED);
        assert_eq!(orphan.line, Some(1));
        assert!(orphan.why.contains("no outstanding invoke"), "{orphan}");

        let twice = why(&format!("{CREATE}\n{CREATE}"));
        assert_eq!(twice.line, Some(2));
        assert!(twice.why.contains("outstanding"), "{twice}");

        let other_key = why(&format!("{CREATE}\n{}", CREATED.replace("k-17", "k-18")));
        assert!(
            other_key.why.contains("f, user and key must repeat"),
            "{other_key}"
        );

        let not_2xx = why(&format!("{CREATE}\n{}", CREATED.replace("201", "409")));
        assert!(not_2xx.why.contains("an ok is a 2xx answer"), "{not_2xx}");

        let no_id = why(&format!(
            "{CREATE}\n{}",
            CREATED.replace(r#""id": "o-1", "#, "")
        ));
        assert!(no_id.why.contains("has no `id`"), "{no_id}");

        let fail_2xx = why(&format!(
            "{CREATE}\n{}",
            CREATED.replace(r#""type": "ok""#, r#""type": "fail""#)
        ));
        assert!(fail_2xx.why.contains("a fail is a refusal"), "{fail_2xx}");
    }

    #[test]
    fn a_list_s_body_is_an_array_of_orders_with_ids() {
        let invoke = r#"{"process": "closing", "type": "invoke", "f": "list", "user": "a", "key": null, "value": null, "time": 5}"#;
        let ok = |body: &str| {
            format!(
                r#"{{"process": "closing", "type": "ok", "f": "list", "user": "a", "key": null, "value": {{"status": 200, "body": {body}}}, "time": 6}}"#
            )
        };
        assert!(parse(&format!("{invoke}\n{}", ok(r#"[{"id": 1}, {"id": "x"}]"#))).is_ok());
        let wrapped = why(&format!("{invoke}\n{}", ok(r#"{"data": []}"#)));
        assert!(
            wrapped.why.contains("the array of the user's orders"),
            "{wrapped}"
        );
        let idless = why(&format!("{invoke}\n{}", ok(r#"[{"id": 1}, {}]"#)));
        assert!(
            idless.why.contains("order 2 of the list has no `id`"),
            "{idless}"
        );
    }
}
