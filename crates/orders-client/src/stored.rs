//! What the client reads back: the order ids a user names and a server
//! answers with, and the outbox's rows. Each is read into a type that holds
//! only what this client writes; anything else is refused with the reason,
//! never guessed. A guessed state could send an answered operation again; a
//! guessed order id would be pasted into a request's path.

use std::fmt;

use diesel::prelude::*;

use super::schema::operations;

/// An order's id as the server issues it: a UUID. Read from its hyphenated
/// (`0193…-…`) or simple (32 hex digits) form, in either case; shown and
/// stored hyphenated and lowercase, as the server writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OrderId(uuid::Uuid);

impl OrderId {
    /// The length of the hyphenated and the simple form. `uuid` also reads a
    /// braced and a `urn:uuid:` form, which no server answer or user holds.
    const LENGTHS: [usize; 2] = [36, 32];

    pub fn parse(raw: &str) -> Option<Self> {
        if !Self::LENGTHS.contains(&raw.len()) {
            return None;
        }
        uuid::Uuid::try_parse(raw).ok().map(Self)
    }

    /// Only the stored form: what [`fmt::Display`] writes.
    fn parse_stored(raw: &str) -> Option<Self> {
        Self::parse(raw).filter(|id| id.to_string() == raw)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Whether `raw` is a UUID as the outbox writes one: hyphenated (an
/// operation's key) or simple (a drainer's id), in lowercase.
fn is_written_uuid(raw: &str, hyphenated: bool) -> bool {
    uuid::Uuid::try_parse(raw).is_ok_and(|u| {
        let written = if hyphenated {
            u.hyphenated().to_string()
        } else {
            u.simple().to_string()
        };
        written == raw
    })
}

/// Where an update or a cancel goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// An order id the server gave.
    Order(OrderId),
    /// The order that queued operation N created (or answered with).
    Operation(i64),
}

impl Target {
    /// `op:N` (N a positive operation id, written as `op:N` shows it), or
    /// else an order id. Nothing around them: not a sign, a leading zero or
    /// a space.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if let Some(digits) = raw.strip_prefix("op:") {
            return digits
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0 && n.to_string() == digits)
                .map(Self::Operation)
                .ok_or_else(|| format!("'{raw}' is not op:N with N a positive operation id"));
        }
        OrderId::parse(raw)
            .map(Self::Order)
            .ok_or_else(|| format!("'{raw}' is neither an order id (a UUID) nor op:N"))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Order(id) => id.fmt(f),
            Self::Operation(n) => write!(f, "op:{n}"),
        }
    }
}

/// The order a `2xx` answer's body names: the one `id` member of the JSON
/// object, when that is an order id. `None` for anything else: a body with
/// two `id` members included (two readers could pick different ones).
pub fn answered_order(body: &str) -> Option<OrderId> {
    #[derive(serde::Deserialize)]
    struct Answer {
        // The derive refuses a second `id` member.
        id: String,
    }
    // The derive also reads a struct from an array: `["<id>"]` names no order.
    if !body
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return None;
    }
    let answer: Answer = serde_json::from_str(body).ok()?;
    OrderId::parse(&answer.id)
}

/// The request an operation makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Post,
    Patch,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Post => "POST",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }

    fn from_stored(raw: &str) -> Option<Self> {
        [Self::Post, Self::Patch, Self::Delete]
            .into_iter()
            .find(|m| m.as_str() == raw)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Not answered yet (maybe sent, maybe not): it will be sent, with its key.
    Pending,
    /// Answered `2xx`; never sent again.
    Done,
    /// Answered with a definitive `4xx` (or its target failed); never sent again.
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }

    fn from_stored(raw: &str) -> Option<Self> {
        [Self::Pending, Self::Done, Self::Failed]
            .into_iter()
            .find(|s| s.as_str() == raw)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The path of a create.
pub const ORDERS: &str = "/v1/orders";
/// The path of an operation on the order another operation answered with:
/// `{order}` stands for that order's id until it is known.
pub const OF_TARGET: &str = "/v1/orders/{order}";

/// An operation's row as the outbox file holds it, before it is read; with
/// the order it was answered with (`operation_orders`), it reads back as an
/// [`Operation`].
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = operations, check_for_backend(diesel::sqlite::Sqlite))]
pub struct Row {
    pub id: i64,
    pub method: String,
    pub path: String,
    pub target_op: Option<i64>,
    pub body: Option<String>,
    pub idempotency_key: String,
    pub resource: String,
    pub state: String,
    pub attempts: i32,
    pub created_at: i64,
    pub next_attempt_at: i64,
    pub lease_owner: Option<String>,
    pub lease_until: Option<i64>,
    pub response_status: Option<i32>,
    pub response_body: Option<String>,
    pub last_error: Option<String>,
}

/// One stored operation, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub id: i64,
    pub method: Method,
    /// [`ORDERS`], `/v1/orders/ID`, or [`OF_TARGET`] with `target_op`.
    pub path: String,
    pub target_op: Option<i64>,
    pub body: Option<String>,
    pub idempotency_key: String,
    pub resource: String,
    pub state: State,
    pub attempts: u32,
    pub created_at: i64,
    pub next_attempt_at: i64,
    pub lease_owner: Option<String>,
    pub lease_until: Option<i64>,
    pub response_status: Option<u16>,
    pub response_body: Option<String>,
    pub last_error: Option<String>,
    /// The order this operation was answered with (done only).
    pub order_id: Option<OrderId>,
}

/// Why a row does not read back as an operation this client wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("operation {id} does not read back: {why}")]
pub struct Unreadable {
    pub id: i64,
    pub why: String,
}

impl Operation {
    /// Reads `row` and the order recorded for it, checking each value
    /// against what the client writes: the method, the state, the path (a
    /// create's, a known order's, or one waiting for an earlier operation's
    /// order), the key, the lease's owner, the attempts, the status, and the
    /// order (a done operation's, in the stored form).
    pub fn read(row: Row, order_id: Option<String>) -> Result<Self, Unreadable> {
        let id = row.id;
        let fail = |why: String| Unreadable { id, why };
        if id <= 0 {
            return Err(fail("its id is not positive".into()));
        }
        let method = Method::from_stored(&row.method)
            .ok_or_else(|| fail(format!("method {:?} is not one it sends", row.method)))?;
        let state = State::from_stored(&row.state).ok_or_else(|| {
            fail(format!(
                "state {:?} is not pending, done or failed",
                row.state
            ))
        })?;
        let path_fits = match (method, row.target_op) {
            (Method::Post, None) => row.path == ORDERS,
            (Method::Post, Some(_)) => false,
            (_, Some(n)) => row.path == OF_TARGET && (1..id).contains(&n),
            (_, None) => row
                .path
                .strip_prefix("/v1/orders/")
                .and_then(OrderId::parse_stored)
                .is_some(),
        };
        if !path_fits {
            return Err(fail(format!(
                "{method} {:?} (target {:?}) is not a request it makes",
                row.path, row.target_op
            )));
        }
        // The key goes into a header, a lease owner into a file name.
        if !is_written_uuid(&row.idempotency_key, true) {
            return Err(fail(format!(
                "key {:?} is not one it makes",
                row.idempotency_key
            )));
        }
        if let Some(owner) = row
            .lease_owner
            .as_deref()
            .filter(|o| !is_written_uuid(o, false))
        {
            return Err(fail(format!("lease owner {owner:?} is not a drainer id")));
        }
        let attempts =
            u32::try_from(row.attempts).map_err(|_| fail(format!("{} attempts", row.attempts)))?;
        let response_status = row
            .response_status
            .map(|s| {
                u16::try_from(s)
                    .ok()
                    .filter(|s| (100..600).contains(s))
                    .ok_or_else(|| fail(format!("status {s} is not an HTTP status")))
            })
            .transpose()?;
        let order_id = match order_id {
            None => None,
            Some(raw) if state == State::Done => Some(
                OrderId::parse_stored(&raw)
                    .ok_or_else(|| fail(format!("order id {raw:?} is not one it stores")))?,
            ),
            Some(_) => return Err(fail(format!("a {state} operation has an order id"))),
        };
        Ok(Self {
            id,
            method,
            path: row.path,
            target_op: row.target_op,
            body: row.body,
            idempotency_key: row.idempotency_key,
            resource: row.resource,
            state,
            attempts,
            created_at: row.created_at,
            next_attempt_at: row.next_attempt_at,
            lease_owner: row.lease_owner,
            lease_until: row.lease_until,
            response_status,
            response_body: row.response_body,
            last_error: row.last_error,
            order_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b";

    fn create_row() -> Row {
        Row {
            id: 2,
            method: "POST".into(),
            path: ORDERS.into(),
            target_op: None,
            body: Some("{}".into()),
            idempotency_key: "0193a5b2-0000-7000-8000-000000000001".into(),
            resource: "op:2".into(),
            state: "pending".into(),
            attempts: 0,
            created_at: 1,
            next_attempt_at: 1,
            lease_owner: None,
            lease_until: None,
            response_status: None,
            response_body: None,
            last_error: None,
        }
    }

    fn refusal(row: Row, order_id: Option<&str>) -> String {
        Operation::read(row, order_id.map(str::to_owned))
            .unwrap_err()
            .why
    }

    #[test]
    fn an_order_id_is_a_uuid_written_hyphenated_or_simple_and_shown_as_the_server_writes_it() {
        let shown = |raw: &str| OrderId::parse(raw).map(|id| id.to_string());
        assert_eq!(shown(ORDER).as_deref(), Some(ORDER));
        assert_eq!(shown(&ORDER.to_uppercase()).as_deref(), Some(ORDER));
        assert_eq!(shown(&ORDER.replace('-', "")).as_deref(), Some(ORDER));
        for refused in [
            "",
            "-",
            "abc",
            "../../x",
            &format!("{{{ORDER}}}"),
            &format!("urn:uuid:{ORDER}"),
            &format!(" {ORDER}"),
        ] {
            assert_eq!(shown(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn a_target_is_op_n_written_as_op_n_shows_it_or_an_order_id() {
        assert_eq!(Target::parse("op:17"), Ok(Target::Operation(17)));
        assert_eq!(
            Target::parse("op:9223372036854775807"),
            Ok(Target::Operation(i64::MAX))
        );
        let order = Target::parse(ORDER).unwrap();
        assert_eq!(order.to_string(), ORDER);
        assert_eq!(Target::parse(&order.to_string()), Ok(order));
        // Found by review of what the fuzz target would check: a sign, a
        // leading zero, spaces and a lone hyphen were read as targets.
        for refused in [
            "op:+5",
            "op:05",
            " op:5 ",
            "op:0",
            "op:-1",
            "op:x",
            "op:9223372036854775808",
            "-",
            "../x",
            "0193ab-cd",
            "",
        ] {
            assert!(Target::parse(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn an_answer_names_an_order_only_by_the_one_id_member_of_an_object() {
        let named = |body: &str| answered_order(body).map(|id| id.to_string());
        assert_eq!(
            named(&format!(r#"{{"id":"{ORDER}","quantity":2}}"#)).as_deref(),
            Some(ORDER)
        );
        assert_eq!(
            named(&format!(r#" {{"i\u0064":"{ORDER}"}}"#)).as_deref(),
            Some(ORDER)
        );
        for none in [
            // Two readers (SQLite's json_extract, serde_json's map) picked
            // different members of a body with two ids.
            format!(r#"{{"id":"{ORDER}","id":"0193a5b2-7c4d-7e8f-9a0b-000000000002"}}"#),
            // Pasted into a path, this id made a request to another route.
            r#"{"id":"../../admin"}"#.to_owned(),
            format!(r#"["{ORDER}"]"#),
            r#"{"id":5}"#.to_owned(),
            r#"{"error":"NOT_FOUND"}"#.to_owned(),
            String::new(),
        ] {
            assert_eq!(named(&none), None, "{none:?}");
        }
    }

    #[test]
    fn a_row_the_outbox_writes_reads_back_with_its_order() {
        let mut done = create_row();
        done.state = "done".into();
        done.response_status = Some(201);
        let op = Operation::read(done, Some(ORDER.into())).unwrap();
        assert_eq!(
            (op.method, op.state, op.order_id.map(|o| o.to_string())),
            (Method::Post, State::Done, Some(ORDER.to_owned()))
        );

        let mut waiting = create_row();
        waiting.method = "PATCH".into();
        waiting.path = OF_TARGET.into();
        waiting.target_op = Some(1);
        assert_eq!(Operation::read(waiting, None).unwrap().target_op, Some(1));
    }

    #[test]
    fn a_row_with_a_state_the_outbox_never_writes_does_not_read_back() {
        // Read as pending, an unknown state sent an answered operation again.
        let mut row = create_row();
        row.state = "sent".into();
        assert!(refusal(row, None).contains("\"sent\""));
    }

    #[test]
    fn a_row_with_negative_attempts_or_a_status_outside_http_does_not_read_back() {
        let mut row = create_row();
        row.attempts = -3;
        assert_eq!(refusal(row, None), "-3 attempts");
        let mut row = create_row();
        row.response_status = Some(70_000);
        assert!(refusal(row, None).contains("70000"));
    }

    #[test]
    fn a_row_whose_request_the_outbox_never_makes_does_not_read_back() {
        let patch = |path: &str, target: Option<i64>| Row {
            method: "PATCH".into(),
            path: path.into(),
            target_op: target,
            ..create_row()
        };
        for row in [
            patch("/v1/orders/../../admin", None),
            patch(&format!("/v1/orders/{}", ORDER.to_uppercase()), None),
            patch(OF_TARGET, None),
            patch(OF_TARGET, Some(2)),
            patch(OF_TARGET, Some(0)),
            Row {
                method: "GET".into(),
                ..create_row()
            },
            Row {
                target_op: Some(1),
                ..create_row()
            },
        ] {
            let shown = format!("{row:?}");
            assert!(Operation::read(row, None).is_err(), "{shown}");
        }
    }

    #[test]
    fn an_order_recorded_for_an_operation_not_done_or_not_in_its_stored_form_does_not_read_back() {
        assert!(refusal(create_row(), Some(ORDER)).contains("pending operation has an order"));
        let mut done = create_row();
        done.state = "done".into();
        assert!(refusal(done.clone(), Some(&ORDER.to_uppercase())).contains("not one it stores"));
        assert!(refusal(done, Some("../../x")).contains("not one it stores"));
    }

    #[test]
    fn a_row_whose_key_or_lease_owner_the_outbox_never_writes_does_not_read_back() {
        let row = |key: &str, owner: Option<&str>| Row {
            idempotency_key: key.into(),
            lease_owner: owner.map(str::to_owned),
            ..create_row()
        };
        let key = "0193a5b2-0000-7000-8000-000000000001";
        let owner = "0193a5b200007000800000000000000a";
        assert!(Operation::read(row(key, Some(owner)), None).is_ok());
        for (key, owner) in [
            ("k", None),
            ("0193A5B2-0000-7000-8000-000000000001", None),
            ("0193a5b2-0000-7000-8000-000000000001\r\nX-Evil: 1", None),
            (key, Some("../../victim")),
            (key, Some(key)),
        ] {
            assert!(
                Operation::read(row(key, owner), None).is_err(),
                "{key:?} {owner:?}"
            );
        }
    }
}
