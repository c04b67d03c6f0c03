//! The `orders` table. Every function takes a connection so that it runs
//! inside the caller's transaction.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use idempotency_ledger::row::{Columns, Row, Timestamp};

use super::input::{OrderFields, cents_amount};
use super::model::{Order, OrderId, OrderStatus};
use crate::db::{Conn, dispatch};

/// A row as stored.
#[derive(Debug, Clone, Queryable)]
pub struct OrderRow {
    pub seq: i64,
    pub id: OrderId,
    pub user_id: String,
    pub item: String,
    pub quantity: i32,
    pub price_cents: i64,
    pub status: String,
    pub idempotency_key: String,
    pub request_fingerprint: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A stored row that breaks a domain rule: a defect or a tampered database.
#[derive(Debug, thiserror::Error)]
#[error("order {0} holds an invalid {1}")]
pub struct CorruptRow(String, &'static str);

impl TryFrom<OrderRow> for Order {
    type Error = CorruptRow;

    fn try_from(row: OrderRow) -> Result<Self, CorruptRow> {
        let id = row.id.to_string();
        // A stored item was trimmed when written; one that is not breaks the rule too.
        let trimmed = row.item.trim() == row.item;
        let fields = OrderFields {
            item: Some(row.item),
            quantity: Some(i64::from(row.quantity)),
            price: Some(cents_amount(row.price_cents)),
        }
        .check()
        .map_err(|errors| {
            let field = match errors.first().map(|e| e.field.as_str()) {
                Some("quantity") => "quantity",
                Some("price") => "price",
                _ => "item",
            };
            CorruptRow(id.clone(), field)
        })?;
        let (Some(item), Some(quantity), Some(price), true) =
            (fields.item, fields.quantity, fields.price, trimmed)
        else {
            return Err(CorruptRow(id, "item"));
        };
        Ok(Order {
            item,
            quantity,
            price,
            status: OrderStatus::parse(&row.status)
                .ok_or_else(|| CorruptRow(id.clone(), "status"))?,
            id: row.id,
            user_id: row.user_id,
            request_fingerprint: row.request_fingerprint,
            created_at: row.created_at,
        })
    }
}

/// A new order as its row stores it: the one description from which every
/// way of writing it is built (see [`idempotency_ledger::row`]) — inside a
/// unit of writing on either backend, and in the ledger's one-statement
/// create on PostgreSQL.
pub struct NewOrderRow {
    id: OrderId,
    user_id: String,
    item: String,
    quantity: i32,
    price_cents: i64,
    status: &'static str,
    idempotency_key: String,
    request_fingerprint: String,
    created_at: Timestamp,
}

impl NewOrderRow {
    pub fn new(order: &Order, idempotency_key: &str) -> Self {
        Self {
            id: order.id,
            user_id: order.user_id.clone(),
            item: order.item.as_str().to_owned(),
            quantity: order.quantity.get(),
            price_cents: order.price.cents(),
            status: order.status.as_str(),
            idempotency_key: idempotency_key.to_owned(),
            request_fingerprint: order.request_fingerprint.clone(),
            created_at: Timestamp::new(order.created_at),
        }
    }
}

impl Row for NewOrderRow {
    const TABLE: &'static str = "orders";
    /// `orders_user_idempotency_key`: the key's second guard.
    const UNIQUE: &'static [&'static str] = &["user_id", "idempotency_key"];

    fn columns<'b, C: Columns<'b>>(&'b self, c: &mut C) -> QueryResult<()> {
        c.column("id", &self.id)?;
        c.column("user_id", self.user_id.as_str())?;
        c.column("item", self.item.as_str())?;
        c.column("quantity", &self.quantity)?;
        c.column("price_cents", &self.price_cents)?;
        c.column("status", self.status)?;
        c.column("idempotency_key", self.idempotency_key.as_str())?;
        c.column("request_fingerprint", self.request_fingerprint.as_str())?;
        c.column("created_at", &self.created_at)?;
        c.column("updated_at", &self.created_at)
    }
}

pub fn find(conn: &mut Conn<'_>, user_id: &str, id: OrderId) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id))).get_result::<OrderRow>(c).optional()
    })
}

pub fn find_by_key(conn: &mut Conn<'_>, user_id: &str, key: &str) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders
            .filter(t::user_id.eq(user_id).and(t::idempotency_key.eq(key)))
            .get_result::<OrderRow>(c)
            .optional()
    })
}

/// The list position of one of the user's orders.
pub fn seq_of(conn: &mut Conn<'_>, user_id: &str, id: OrderId) -> QueryResult<Option<i64>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id))).select(t::seq).get_result::<i64>(c).optional()
    })
}

/// The user's orders with `seq < before`, newest first.
pub fn list(
    conn: &mut Conn<'_>,
    user_id: &str,
    before: Option<i64>,
    limit: i64,
) -> QueryResult<Vec<OrderRow>> {
    let before = before.unwrap_or(i64::MAX);
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        t::orders
            .filter(t::user_id.eq(user_id).and(t::seq.lt(before)))
            .order(t::seq.desc())
            .limit(limit)
            .load::<OrderRow>(c)
    })
}

/// The fields a patch may change; `None` leaves a column as it is.
pub struct Changes<'a> {
    pub item: Option<&'a str>,
    pub quantity: Option<i32>,
    pub price_cents: Option<i64>,
}

/// Applies `changes` to a pending order and returns the new row; `None`
/// when no pending order of this user has that id.
pub fn update_pending(
    conn: &mut Conn<'_>,
    user_id: &str,
    id: OrderId,
    changes: &Changes<'_>,
    now: DateTime<Utc>,
) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        diesel::update(t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id)).and(t::status.eq("pending"))))
            .set((
                changes.item.map(|v| t::item.eq(v)),
                changes.quantity.map(|v| t::quantity.eq(v)),
                changes.price_cents.map(|v| t::price_cents.eq(v)),
                t::updated_at.eq(now),
            ))
            .returning(s::orders::all_columns)
            .get_result::<OrderRow>(c)
            .optional()
    })
}

/// Sets a pending order's status; `None` when no pending order matched.
pub fn set_status_from_pending(
    conn: &mut Conn<'_>,
    user_id: &str,
    id: OrderId,
    status: OrderStatus,
    now: DateTime<Utc>,
) -> QueryResult<Option<OrderRow>> {
    dispatch!(conn, c, s => {
        use s::orders::dsl as t;
        diesel::update(t::orders.filter(t::user_id.eq(user_id).and(t::id.eq(id)).and(t::status.eq("pending"))))
            .set((t::status.eq(status.as_str()), t::updated_at.eq(now)))
            .returning(s::orders::all_columns)
            .get_result::<OrderRow>(c)
            .optional()
    })
}
