//! `orders-api client …`: the command line of the offline-first client.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use super::drain::{SendError, Sender, Server};
use super::outbox::{NewOperation, Outbox, OutboxError, Outcome};
use super::stored::{Operation, State, Target};

/// `orders-api client [--server URL] [--token TOKEN] [--outbox PATH] COMMAND`
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The server operations are sent to: http(s)://HOST, with a :PORT and a
    /// /PATH if any (each operation's path, /v1/orders…, is appended to it);
    /// no query, fragment or dot segments.
    #[arg(
        long = "server",
        env = "ORDERS_API_URL",
        default_value = "http://127.0.0.1:8080",
        global = true,
        value_parser = server_url
    )]
    pub server: String,

    /// A bearer token (`orders-api keys create USER_ID`).
    #[arg(
        long = "token",
        env = "ORDERS_API_TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub token: Option<String>,

    /// The outbox file [default: $XDG_DATA_HOME/orders-api/outbox.db, or
    /// ~/.local/share/orders-api/outbox.db].
    #[arg(long = "outbox", env = "ORDERS_OUTBOX", global = true)]
    pub outbox: Option<PathBuf>,

    #[command(subcommand)]
    pub command: ClientCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ClientCommand {
    /// Queue an order, then try once to send it; prints the operation's id
    /// (`op:N`), and the order when the server answered.
    Create {
        #[arg(long)]
        item: String,
        #[arg(long, value_parser = json_number)]
        quantity: serde_json::Number,
        #[arg(long, value_parser = json_number)]
        price: serde_json::Number,
    },
    /// Queue a change to an order (an order id, or op:N: the order operation N created).
    Update {
        #[arg(value_name = "ORDER_OR_OP", value_parser = Target::parse)]
        target: Target,
        #[arg(long)]
        item: Option<String>,
        #[arg(long, value_parser = json_number)]
        quantity: Option<serde_json::Number>,
        #[arg(long, value_parser = json_number)]
        price: Option<serde_json::Number>,
    },
    /// Queue the cancellation of an order (an order id, or op:N).
    Cancel {
        #[arg(value_name = "ORDER_OR_OP", value_parser = Target::parse)]
        target: Target,
    },
    /// Send every pending operation, retrying with backoff; exits non-zero
    /// when something is still pending after --max-wait.
    Sync {
        /// Seconds to keep retrying while something is pending.
        #[arg(long = "max-wait", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
        max_wait: u64,
    },
    /// Every operation: pending, done or failed, with its key and answer.
    Status {
        #[arg(long)]
        json: bool,
    },
}

/// Why a client command failed: one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("no token: pass --token or set ORDERS_API_TOKEN")]
    NoToken,
    #[error("no outbox path: pass --outbox, or set ORDERS_OUTBOX, XDG_DATA_HOME or HOME")]
    NoOutboxPath,
    #[error("an update needs at least one of --item, --quantity, --price")]
    EmptyUpdate,
    #[error("op:{id} failed: {answer}")]
    Failed { id: i64, answer: String },
    /// `last` is empty or ` (last: REASON)`.
    #[error("{pending} operation(s) still pending after {waited}s{last}")]
    StillPending {
        pending: i64,
        waited: u64,
        last: String,
    },
    #[error(
        "{count} operation(s) of the outbox do not read back (shown as unreadable): something other than this client changed it"
    )]
    Unreadable { count: usize },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A number flag: its text, which is sent as it is (a JSON number).
pub(crate) fn json_number(raw: &str) -> Result<serde_json::Number, String> {
    raw.trim()
        .parse()
        .map_err(|_| format!("'{raw}' is not a number"))
}

/// `--server` / `ORDERS_API_URL`: `http(s)://HOST[:PORT][/PATH]`, the base
/// each operation's path (`/v1/orders…`) is appended to, kept as typed (a
/// trailing `/` dropped, the scheme lowercased). Refused in one line, since the operation would go
/// to another URL than the one written and be failed for good by whatever
/// answers there: another scheme, no host, user information, a query or a
/// fragment (the operation's path would land in it), a dot segment (`.`,
/// `..`, also written `%2e`, which URL parsers remove), and a path that a
/// WHATWG URL parser would rewrite or that the request's URI cannot carry.
pub fn server_url(raw: &str) -> Result<String, String> {
    let typed = raw.trim();
    let refuse = |why: &str| {
        format!(
            "{typed:?} is not a server URL ({why}): expected http(s)://HOST[:PORT][/PATH], \
             with no query, fragment or dot segments"
        )
    };
    let Some((scheme, rest)) = typed.split_once("://") else {
        return Err(refuse("no scheme"));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(refuse("the scheme is not http or https"));
    }
    if typed.contains('?') {
        return Err(refuse("it has a query"));
    }
    if typed.contains('#') {
        return Err(refuse("it has a fragment"));
    }
    let path = rest.find(['/', '\\']).map_or("", |start| &rest[start..]);
    if path.split(['/', '\\']).any(is_dot_segment) {
        return Err(refuse("it has a dot segment"));
    }
    let url = url::Url::parse(typed).map_err(|e| refuse(&e.to_string()))?;
    if url.host().is_none() {
        return Err(refuse("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("it has a user; the token goes in --token"));
    }
    let path = path.trim_end_matches('/');
    if url.path().trim_end_matches('/') != path {
        return Err(refuse("its path would not be sent as written"));
    }
    // The scheme as the request is built with it: lowercase.
    let base = format!(
        "{}://{}",
        scheme.to_ascii_lowercase(),
        rest.trim_end_matches('/')
    );
    if format!("{base}/v1/orders")
        .parse::<ureq::http::Uri>()
        .is_err()
    {
        return Err(refuse("a request cannot carry it"));
    }
    Ok(base)
}

/// `.` or `..`, any of its dots written `%2e` (as URL parsers read them).
pub(crate) fn is_dot_segment(segment: &str) -> bool {
    let dots = segment.to_ascii_lowercase().replace("%2e", ".");
    dots == "." || dots == ".."
}

/// The outbox when none is named: in the user's data directory (XDG).
pub fn default_outbox() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let data = non_empty("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".local/share")))?;
    Some(data.join("orders-api").join("outbox.db"))
}

pub fn run(args: ClientArgs) -> Result<(), ClientError> {
    let path = args
        .outbox
        .clone()
        .or_else(default_outbox)
        .ok_or(ClientError::NoOutboxPath)?;
    let mut outbox = Outbox::open(&path)?;
    let server = || -> Result<Server, ClientError> {
        let token = args.token.as_deref().ok_or(ClientError::NoToken)?;
        Ok(Server::new(&args.server, token))
    };
    match args.command {
        ClientCommand::Create {
            item,
            quantity,
            price,
        } => {
            let body = json!({ "item": item, "quantity": quantity, "price": price });
            queue_and_try(&mut outbox, server()?, NewOperation::Create { body })
        }
        ClientCommand::Update {
            target,
            item,
            quantity,
            price,
        } => {
            let mut body = Map::new();
            if let Some(item) = item {
                body.insert("item".into(), Value::String(item));
            }
            if let Some(quantity) = quantity {
                body.insert("quantity".into(), Value::Number(quantity));
            }
            if let Some(price) = price {
                body.insert("price".into(), Value::Number(price));
            }
            if body.is_empty() {
                return Err(ClientError::EmptyUpdate);
            }
            let body = Value::Object(body);
            queue_and_try(
                &mut outbox,
                server()?,
                NewOperation::Update { target, body },
            )
        }
        ClientCommand::Cancel { target } => {
            queue_and_try(&mut outbox, server()?, NewOperation::Cancel { target })
        }
        ClientCommand::Sync { max_wait } => sync(&mut outbox, server()?, max_wait),
        ClientCommand::Status { json } => status(&mut outbox, json),
    }
}

/// Enqueue, then one attempt (no backoff): an unreachable server leaves the
/// operation pending, which is not an error.
fn queue_and_try(
    outbox: &mut Outbox,
    server: Server,
    operation: NewOperation,
) -> Result<(), ClientError> {
    let op = outbox.enqueue(operation)?;
    println!("op:{}", op.id);
    let outcome = Sender::new(outbox, server)?.try_once(op.id)?;
    let mut err = std::io::stderr();
    match outcome {
        None => {
            writeln!(
                err,
                "op:{} queued behind earlier operations on its order; `orders-api client sync` sends it",
                op.id
            )?;
        }
        Some(Outcome::Retry { reason, .. }) => {
            writeln!(
                err,
                "op:{} pending (key {}): {reason}; `orders-api client sync` sends it",
                op.id, op.idempotency_key
            )?;
        }
        Some(Outcome::Answered { status, body }) if (200..300).contains(&status) => {
            println!("{body}");
        }
        Some(Outcome::Answered { .. }) => {
            let op = outbox.get(op.id)?;
            return Err(ClientError::Failed {
                id: op.id,
                answer: answer_line(&op),
            });
        }
    }
    Ok(())
}

fn sync(outbox: &mut Outbox, server: Server, max_wait: u64) -> Result<(), ClientError> {
    let terminal = std::io::stderr().is_terminal();
    let mut sender = Sender::new(outbox, server)?;
    let drained = sender.drain(Duration::from_secs(max_wait), |outbox| {
        if terminal && let Ok(ops) = outbox.list() {
            let count = |s: State| ops.iter().filter(|o| o.state == s).count();
            eprint!(
                "\rsync: {} pending, {} done, {} failed   ",
                count(State::Pending),
                count(State::Done),
                count(State::Failed)
            );
        }
    })?;
    if terminal {
        eprintln!();
    }
    if drained.pending > 0 {
        return Err(ClientError::StillPending {
            pending: drained.pending,
            waited: max_wait,
            last: match (drained.last_error, drained.next_due_in) {
                (Some(last), Some(next)) => format!(
                    " (last: {last}; next try in {} s)",
                    next.as_millis().div_ceil(1000)
                ),
                (Some(last), None) => format!(" (last: {last})"),
                (None, Some(next)) => {
                    format!(" (next try in {} s)", next.as_millis().div_ceil(1000))
                }
                (None, None) => String::new(),
            },
        });
    }
    Ok(())
}

/// Every row, a row that does not read back included (with why); then an
/// error when there was one.
fn status(outbox: &mut Outbox, as_json: bool) -> Result<(), ClientError> {
    let ops = outbox.list_with_unreadable()?;
    let mut out = std::io::stdout().lock();
    if as_json {
        let ops: Vec<Value> = ops
            .iter()
            .map(|op| match op {
                Ok(op) => operation_json(op),
                Err(unreadable) => json!({ "id": unreadable.id, "unreadable": unreadable.why }),
            })
            .collect();
        writeln!(out, "{}", Value::Array(ops))?;
    } else {
        writeln!(
            out,
            "{:<7} {:<8} {:<7} {:<22} {:<37} ANSWER",
            "OP", "STATE", "METHOD", "PATH", "KEY"
        )?;
        for op in &ops {
            match op {
                Ok(op) => writeln!(
                    out,
                    "{:<7} {:<8} {:<7} {:<22} {:<37} {}",
                    format!("op:{}", op.id),
                    op.state,
                    op.method,
                    display_path(op),
                    op.idempotency_key,
                    answer_line(op)
                )?,
                Err(unreadable) => writeln!(
                    out,
                    "{:<7} {:<8} {:<7} {:<22} {:<37} {}",
                    format!("op:{}", unreadable.id),
                    "unreadable",
                    "-",
                    "-",
                    "-",
                    unreadable.why
                )?,
            }
        }
    }
    match ops.iter().filter(|op| op.is_err()).count() {
        0 => Ok(()),
        count => Err(ClientError::Unreadable { count }),
    }
}

/// The path, with an unresolved target shown as `op:N`.
fn display_path(op: &Operation) -> String {
    match op.target_op {
        Some(n) => op.path.replace("{order}", &format!("<op:{n}>")),
        None => op.path.clone(),
    }
}

fn answer_line(op: &Operation) -> String {
    let body = op.response_body.as_deref().unwrap_or_default();
    match (op.state, op.response_status) {
        (State::Pending, _) => match &op.last_error {
            Some(e) => format!("- ({} attempt(s); last: {e})", op.attempts),
            None => format!("- ({} attempt(s))", op.attempts),
        },
        (_, Some(status)) => format!("{status} {body}"),
        (_, None) => body.to_owned(),
    }
}

fn operation_json(op: &Operation) -> Value {
    let answer = op.response_body.as_ref().map(|body| {
        json!({
            "status": op.response_status,
            "body": serde_json::from_str::<Value>(body).unwrap_or_else(|_| Value::String(body.clone())),
        })
    });
    let time = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    };
    json!({
        "id": op.id,
        "state": op.state,
        "method": op.method,
        "path": display_path(op),
        "target_op": op.target_op,
        "key": op.idempotency_key,
        "body": op.body.as_deref().and_then(|b| serde_json::from_str::<Value>(b).ok()),
        "created_at": time(op.created_at),
        "attempts": op.attempts,
        "last_error": op.last_error,
        "answer": answer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ClientArgs,
    }

    #[test]
    fn the_commands_parse_with_their_flags() {
        let cli = Cli::try_parse_from([
            "client",
            "update",
            "op:3",
            "--quantity",
            "4",
            "--server",
            "http://x:1",
            "--outbox",
            "o.db",
        ])
        .unwrap();
        assert_eq!(cli.args.server, "http://x:1");
        assert!(matches!(
            cli.args.command,
            ClientCommand::Update {
                target: Target::Operation(3),
                quantity: Some(_),
                item: None,
                price: None
            }
        ));
        assert!(
            Cli::try_parse_from([
                "client",
                "create",
                "--item",
                "W",
                "--quantity",
                "two",
                "--price",
                "1"
            ])
            .is_err()
        );
        assert!(Cli::try_parse_from(["client", "cancel", "op:x"]).is_err());
    }

    #[test]
    fn a_server_url_with_a_query_a_fragment_or_dot_segments_is_refused_in_one_line() {
        for (raw, why) in [
            ("http://h:1/?a=1", "query"),
            ("http://h:1?", "query"),
            ("http://h:1/#x", "fragment"),
            ("http://h:1#", "fragment"),
            ("http://h:1/a/../b", "dot segment"),
            ("http://h:1/..", "dot segment"),
            ("http://h:1/./a", "dot segment"),
            ("http://h:1/%2e%2E/a", "dot segment"),
            ("http://h:1/.%2e", "dot segment"),
            ("http://h:1\\..\\a", "dot segment"),
            ("http://u:p@h:1", "user"),
            ("ftp://h", "scheme"),
            ("h:1", "scheme"),
            ("http://", "host"),
            ("http://h:99999", "port"),
            ("http://h:1/a b", "as written"),
            ("http://h:1/a\\b", "as written"),
        ] {
            let err = server_url(raw).unwrap_err();
            assert!(err.contains(why) && !err.contains('\n'), "{raw}: {err}");
        }
        for (raw, base) in [
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("https://orders.example/api/", "https://orders.example/api"),
            (" http://h:1/a/b ", "http://h:1/a/b"),
            ("http://h:1/a.b/..c/...", "http://h:1/a.b/..c/..."),
            ("HTTPS://H:1/A", "https://H:1/A"),
        ] {
            assert_eq!(server_url(raw).as_deref(), Ok(base), "{raw}");
        }
    }
}
