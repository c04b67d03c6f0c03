//! Creating one order safely over an unreliable network, with the client
//! library (`orders_client`), in a few lines:
//!
//! 1. the operation is stored in the outbox, with a fresh `Idempotency-Key`,
//!    and fsynced, before anything is sent;
//! 2. the drain sends it with that key, again and again (full-jitter
//!    backoff, at least `Retry-After`) on a connection error, a timeout, a
//!    `5xx` or `409 IDEMPOTENCY_IN_PROGRESS`, until a definitive answer is
//!    recorded. Killed halfway, the next run sends it with the same key.
//!
//! `orders-api client create|sync|status` is the same thing as a command.
//!
//! ```text
//! ORDERS_API_TOKEN=oa_… cargo run --example retrying_client -- Widget 2 9.99
//! ```
//!
//! `ORDERS_API_URL` (default `http://127.0.0.1:8080`) and `ORDERS_OUTBOX`
//! (default: the client's outbox in the user's data directory) may be set.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use orders_client::command::default_outbox;
use orders_client::{NewOperation, Outbox, Sender, Server, State};

fn run(item: &str, quantity: &str, price: &str) -> Result<String, String> {
    let number = |text: &str| {
        text.parse::<serde_json::Number>()
            .map_err(|_| format!("{text:?} is not a number"))
    };
    let body =
        serde_json::json!({ "item": item, "quantity": number(quantity)?, "price": number(price)? });
    let url = std::env::var("ORDERS_API_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let token = std::env::var("ORDERS_API_TOKEN").map_err(|_| "set ORDERS_API_TOKEN")?;
    let path = std::env::var_os("ORDERS_OUTBOX")
        .map(PathBuf::from)
        .or_else(default_outbox)
        .ok_or("set ORDERS_OUTBOX")?;

    let mut outbox = Outbox::open(&path).map_err(|e| e.to_string())?;
    let id = outbox
        .enqueue(NewOperation::Create { body })
        .map_err(|e| e.to_string())?
        .id;
    let mut sender =
        Sender::new(&mut outbox, Server::new(&url, &token)).map_err(|e| e.to_string())?;
    sender
        .drain(Duration::from_secs(60), |_| {})
        .map_err(|e| e.to_string())?;

    let op = outbox.get(id).map_err(|e| e.to_string())?;
    let answer = op.response_body.clone().unwrap_or_default();
    match op.state {
        State::Done => Ok(answer),
        State::Failed => Err(format!(
            "refused ({}): {answer}",
            op.response_status.unwrap_or(0)
        )),
        State::Pending => Err(format!(
            "op:{id} is still pending (key {}); `orders-api client sync` resends it",
            op.idempotency_key
        )),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [item, quantity, price] = args.as_slice() else {
        eprintln!("usage: retrying_client ITEM QUANTITY PRICE");
        return ExitCode::from(2);
    };
    match run(item, quantity, price) {
        Ok(order) => {
            println!("{order}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("retrying_client: {e}");
            ExitCode::FAILURE
        }
    }
}
