//! The orders domain: what an order is, how it is validated and stored, and
//! the operations the API offers. Mutations take a [`LedgerTx`], so they can
//! only run inside the idempotency ledger's transaction (a create hands the
//! ledger its [`NewOrderRow`] to insert); the table's storage functions are
//! private to this module, so nothing else can write an order.
//!
//! ```compile_fail,E0603
//! // Outside the crate (and outside this module) the storage is out of reach.
//! use orders_api::orders::store;
//! ```

pub mod input;
pub mod model;
pub mod money;
mod store;

use chrono::{DateTime, SubsecRound, Utc};
use diesel::result::Error as DieselError;

use idempotency_ledger::{Fingerprint, IdempotencyKey, LedgerTx};

use crate::db::Conn;
use input::{NewOrder, OrderPatch};
use model::{Order, OrderId, OrderStatus};
use store::Changes;
pub use store::{CorruptRow, NewOrderRow};

/// Why an orders operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum OrdersError {
    #[error("no such order")]
    NotFound,
    #[error("the order is not pending")]
    NotPending,
    #[error("the cursor names no position in this user's orders")]
    UnknownCursor,
    #[error(transparent)]
    Corrupt(#[from] CorruptRow),
    #[error(transparent)]
    Database(#[from] DieselError),
}

/// What [`existing`] found under a create's key.
#[derive(Debug)]
pub enum Created {
    /// The order this key already created, by a request with the same
    /// fingerprint: a retry arriving after the ledger entry was purged.
    Existing(Order),
    /// This key created an order from a different request.
    KeyReused,
}

/// The clock, at the precision both databases store (microseconds).
fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

/// The order a create request makes, before it is stored.
pub fn prepare(user_id: &str, fingerprint: &Fingerprint, new: NewOrder) -> Order {
    Order {
        id: OrderId::generate(),
        user_id: user_id.to_owned(),
        item: new.item,
        quantity: new.quantity,
        price: new.price,
        status: OrderStatus::Pending,
        request_fingerprint: fingerprint.as_str().to_owned(),
        created_at: now(),
    }
}

/// The row that stores `order` for `key`: the ledger inserts it (see
/// `idempotency_ledger::Ledger::execute_insert`), `ON CONFLICT DO NOTHING`
/// on `UNIQUE (user_id, idempotency_key)`.
pub fn new_row(order: &Order, key: &IdempotencyKey) -> NewOrderRow {
    NewOrderRow::new(order, key.as_str())
}

/// What a create found when its row was refused: `UNIQUE (user_id,
/// idempotency_key)` holds the order this key made before — by a request
/// with the same fingerprint (a retry after the ledger's entry was purged),
/// or by another request.
pub fn existing(
    tx: &mut LedgerTx<'_, '_>,
    user_id: &str,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Result<Created, OrdersError> {
    let existing: Order = store::find_by_key(tx.conn(), user_id, key.as_str())?
        .ok_or(OrdersError::NotFound)?
        .try_into()?;
    Ok(if existing.request_fingerprint == fingerprint.as_str() {
        Created::Existing(existing)
    } else {
        Created::KeyReused
    })
}

pub fn get(conn: &mut Conn<'_>, user_id: &str, id: &str) -> Result<Order, OrdersError> {
    let id = OrderId::parse(id).ok_or(OrdersError::NotFound)?;
    Ok(store::find(conn, user_id, id)?
        .ok_or(OrdersError::NotFound)?
        .try_into()?)
}

/// An opaque position in a user's order list: the last order of the page
/// before. Only a cursor naming one of the caller's own orders is accepted,
/// so a client cannot page from a position the server never handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor(OrderId);

impl Cursor {
    pub fn encode(self) -> String {
        self.0.simple()
    }

    /// The cursor's shape only: exactly the text [`Cursor::encode`] writes
    /// (32 lowercase hex digits); [`list`] checks that it names an order.
    pub fn decode(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        OrderId::parse(s).map(Self)
    }
}

/// One page of a user's orders, newest first.
#[derive(Debug)]
pub struct Page {
    pub orders: Vec<Order>,
    pub next: Option<Cursor>,
}

pub fn list(
    conn: &mut Conn<'_>,
    user_id: &str,
    after: Option<Cursor>,
    limit: u8,
) -> Result<Page, OrdersError> {
    let limit = i64::from(limit);
    let before = match after {
        Some(cursor) => {
            Some(store::seq_of(conn, user_id, cursor.0)?.ok_or(OrdersError::UnknownCursor)?)
        }
        None => None,
    };
    let mut rows = store::list(conn, user_id, before, limit + 1)?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next = if more {
        rows.last().map(|r| Cursor(r.id))
    } else {
        None
    };
    let orders = rows
        .into_iter()
        .map(Order::try_from)
        .collect::<Result<_, _>>()?;
    Ok(Page { orders, next })
}

pub fn update(
    tx: &mut LedgerTx<'_, '_>,
    user_id: &str,
    id: &str,
    patch: &OrderPatch,
) -> Result<Order, OrdersError> {
    let id = OrderId::parse(id).ok_or(OrdersError::NotFound)?;
    let changes = Changes {
        item: patch.item.as_ref().map(|i| i.as_str()),
        quantity: patch.quantity.map(|q| q.get()),
        price_cents: patch.price.map(|p| p.cents()),
    };
    match store::update_pending(tx.conn(), user_id, id, &changes, now())? {
        Some(row) => Ok(row.try_into()?),
        None => match store::find(tx.conn(), user_id, id)? {
            Some(_) => Err(OrdersError::NotPending),
            None => Err(OrdersError::NotFound),
        },
    }
}

/// Cancels an order; cancelling a cancelled order changes nothing.
pub fn cancel(tx: &mut LedgerTx<'_, '_>, user_id: &str, id: &str) -> Result<Order, OrdersError> {
    let id = OrderId::parse(id).ok_or(OrdersError::NotFound)?;
    match store::set_status_from_pending(tx.conn(), user_id, id, OrderStatus::Cancelled, now())? {
        Some(row) => Ok(row.try_into()?),
        None => Ok(store::find(tx.conn(), user_id, id)?
            .ok_or(OrdersError::NotFound)?
            .try_into()?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotency_ledger::canonical_json;

    /// Stored orders hold fingerprints computed by earlier builds: the
    /// function of the request must never change, or their retries would be
    /// refused as a reused key. The first is also SHA-256 of
    /// `POST\0/v1/orders\0json:{"item":"Widget","price":9.99,"quantity":2}`
    /// computed elsewhere; the others are pinned as stored.
    #[test]
    fn fingerprints_stay_what_earlier_builds_stored() {
        for (method, path, body, json, pinned) in [
            (
                "POST",
                "/v1/orders",
                r#"{"item":"Widget","quantity":2,"price":9.99}"#,
                true,
                "933cbef6eba0efef446d41a439eef360b8cc387896ad841d42a0c868105bf234",
            ),
            (
                "PATCH",
                "/v1/orders/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b",
                r#"{ "quantity": 3, "price": 1e2 }"#,
                true,
                "830fc2d357a78a700a4cf19086e0d7b1392c36c3f61d7376d10b3cb91707be07",
            ),
            (
                "POST",
                "/v1/orders",
                r#"{"\u20ac":[1.50,-0,1e400,9007199254740993,0.1e-7],"\r":{"b":null,"a":true},"1":"\u0001\"/"}"#,
                true,
                "40423b3f41d6b15bd1903ea77d3d18039ecc268ee6fb1126a81e8890ed03bdd0",
            ),
            (
                "DELETE",
                "/v1/orders/x",
                "",
                false,
                "4392248eca66c6a775f5f398021e762938ed41d2c4a6b70d05495fad88ff3417",
            ),
            (
                "POST",
                "/p",
                "a=1&b=2",
                false,
                "ebff649048a88d2912a6d946d5042ff8a519ee91122c285d96eefe9f682add4b",
            ),
        ] {
            assert_eq!(canonical_json(body.as_bytes()).is_ok(), json, "{body}");
            let got = Fingerprint::of(method, path, body.as_bytes());
            assert_eq!(got.as_str(), pinned, "{method} {path} {body}");
        }
    }

    #[test]
    fn a_cursor_survives_its_round_trip_and_malformed_ones_are_refused() {
        let c = Cursor(OrderId::generate());
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        for bad in [
            "",
            "abc",
            "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
            "0000000000000000",
            // Uppercase names the same id, but the server never writes it.
            "0193A8E48F3C7CC29D6A5B1F2E3D4C5B",
            "1'; DROP TABLE x",
        ] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
