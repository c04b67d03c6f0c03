//! Domain types that cannot hold an invalid order.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::Pg;
use diesel::query_builder::AstPass;
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types;
use diesel::sqlite::Sqlite;
use rust_decimal::Decimal;
use serde::Serialize;
use uuid::Uuid;

/// An order's public id: a UUIDv7, stored as `UUID` on PostgreSQL and as
/// text on SQLite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, AsExpression, FromSqlRow)]
#[diesel(sql_type = sql_types::Uuid)]
#[diesel(sql_type = sql_types::Text)]
pub struct OrderId(Uuid);

impl OrderId {
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    /// The id as 32 hex digits.
    pub fn simple(self) -> String {
        self.0.simple().to_string()
    }

    /// Any well-formed UUID; anything else names no order.
    pub fn parse(s: &str) -> Option<Self> {
        Uuid::try_parse(s).ok().map(Self)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl ToSql<sql_types::Uuid, Pg> for OrderId {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <Uuid as ToSql<sql_types::Uuid, Pg>>::to_sql(&self.0, out)
    }
}

impl FromSql<sql_types::Uuid, Pg> for OrderId {
    fn from_sql(
        bytes: <Pg as diesel::backend::Backend>::RawValue<'_>,
    ) -> deserialize::Result<Self> {
        <Uuid as FromSql<sql_types::Uuid, Pg>>::from_sql(bytes).map(Self)
    }
}

impl ToSql<sql_types::Text, Sqlite> for OrderId {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
        out.set_value(self.0.hyphenated().to_string());
        Ok(serialize::IsNull::No)
    }
}

impl FromSql<sql_types::Text, Sqlite> for OrderId {
    fn from_sql(
        value: <Sqlite as diesel::backend::Backend>::RawValue<'_>,
    ) -> deserialize::Result<Self> {
        let text = <String as FromSql<sql_types::Text, Sqlite>>::from_sql(value)?;
        Ok(Self(Uuid::try_parse(&text)?))
    }
}

/// How the ledger's row descriptions bind an order id: a `UUID` on
/// PostgreSQL, its hyphenated text on SQLite.
impl idempotency_ledger::row::Bind<Sqlite> for OrderId {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Sqlite>) -> diesel::QueryResult<()> {
        out.push_bind_param::<sql_types::Text, OrderId>(self)
    }
}

impl idempotency_ledger::row::Bind<Pg> for OrderId {
    fn bind<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        out.push_bind_param::<sql_types::Uuid, OrderId>(self)
    }
}

/// What was ordered: trimmed, 1..=200 characters, no control characters
/// (the rules are [`super::input::OrderFields`]'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item(String);

impl Item {
    pub const MAX_CHARS: u64 = 200;

    /// An item that passed the field rules.
    pub(super) fn from_validated(item: String) -> Self {
        Self(item)
    }

    /// A stored item, if it still has the shape the rules gave it: not
    /// empty, trimmed, at most [`Item::MAX_CHARS`] characters, none of them
    /// a control character. One pass, no allocation.
    pub(super) fn from_stored(item: String) -> Option<Self> {
        let trimmed = item.trim().len() == item.len();
        let mut chars = 0u64;
        for c in item.chars() {
            chars += 1;
            if c.is_control() || chars > Self::MAX_CHARS {
                return None;
            }
        }
        (trimmed && chars > 0).then_some(Self(item))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How many: a whole number in `1..=1_000_000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity(i32);

impl Quantity {
    pub const MIN: i64 = 1;
    pub const MAX: i64 = 1_000_000;

    /// A quantity that passed the field rules; `None` only beyond `i32`.
    pub(super) fn from_validated(n: i64) -> Option<Self> {
        i32::try_from(n).ok().map(Self)
    }

    /// A stored quantity, if it is in range.
    pub(super) fn from_stored(n: i32) -> Option<Self> {
        (Self::MIN..=Self::MAX)
            .contains(&i64::from(n))
            .then_some(Self(n))
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

/// An exact amount of money in cents, `0 ..= 1_000_000_000.00`. Never a float.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Money(i64);

impl Money {
    pub const MAX_CENTS: i64 = 100_000_000_000;
    /// The largest price, 1000000000.
    pub const MAX: Decimal = Decimal::from_parts(1_000_000_000, 0, 0, false, 0);

    /// An amount that passed the money rule; `None` only when it is not
    /// whole cents or beyond `i64` cents.
    pub(super) fn from_validated(amount: Decimal) -> Option<Self> {
        let cents = amount.checked_mul(Decimal::ONE_HUNDRED)?.normalize();
        if cents.scale() != 0 {
            return None;
        }
        i64::try_from(cents.mantissa()).ok().map(Self)
    }

    /// A stored amount of cents, if it is in range.
    pub(super) fn from_stored_cents(cents: i64) -> Option<Self> {
        (0..=Self::MAX_CENTS)
            .contains(&cents)
            .then_some(Self(cents))
    }

    pub fn cents(self) -> i64 {
        self.0
    }

    /// `self × quantity`, exact: an `i64` times an `i32` always fits `i128`.
    pub fn times(self, quantity: Quantity) -> i128 {
        i128::from(self.0) * i128::from(quantity.get())
    }
}

/// Writes cents as the exact decimal text of a JSON number (`1998` → `19.98`).
pub fn cents_to_json(cents: impl Into<i128>) -> serde_json::Number {
    let cents: i128 = cents.into();
    let sign = if cents < 0 { "-" } else { "" };
    let abs = cents.unsigned_abs();
    serde_json::Number::from_string_unchecked(format!("{sign}{}.{:02}", abs / 100, abs % 100))
}

/// An order's life: created pending, possibly cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrderStatus {
    Pending,
    Cancelled,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "pending",
            OrderStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(OrderStatus::Pending),
            "cancelled" => Some(OrderStatus::Cancelled),
            _ => None,
        }
    }
}

/// An order as the domain holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub id: OrderId,
    pub user_id: String,
    pub item: Item,
    pub quantity: Quantity,
    pub price: Money,
    pub status: OrderStatus,
    /// The fingerprint of the request that created it.
    pub request_fingerprint: String,
    pub created_at: DateTime<Utc>,
}

/// An order as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct OrderView {
    /// Opaque order id (a UUID).
    #[schema(example = "0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b")]
    pub id: String,
    #[schema(example = "Widget", min_length = 1, max_length = 200)]
    pub item: String,
    #[schema(example = 2, minimum = 1, maximum = 1000000)]
    pub quantity: i32,
    /// Unit price; the JSON text is the exact decimal amount.
    #[schema(value_type = f64, example = 9.99, minimum = 0, maximum = 1000000000)]
    pub price: serde_json::Number,
    /// `quantity × price`, exact, computed by the server.
    #[schema(value_type = f64, example = 19.98, minimum = 0)]
    pub total_price: serde_json::Number,
    pub status: OrderStatus,
    /// RFC 3339, UTC.
    #[schema(example = "2026-11-29T18:30:00.000Z")]
    pub created_at: String,
}

impl Order {
    pub fn view(&self) -> OrderView {
        OrderView {
            id: self.id.to_string(),
            item: self.item.as_str().to_owned(),
            quantity: self.quantity.get(),
            price: cents_to_json(self.price.cents()),
            total_price: cents_to_json(self.price.times(self.quantity)),
            status: self.status,
            created_at: self.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_is_written_as_its_exact_decimal() {
        assert_eq!(cents_to_json(30).to_string(), "0.30");
        assert_eq!(cents_to_json(1998).to_string(), "19.98");
        let total = Money(99_999_999_999).times(Quantity(999_999));
        assert_eq!(cents_to_json(total).to_string(), "999998999990000.01");
        let most = Money(Money::MAX_CENTS).times(Quantity(1_000_000));
        assert_eq!(cents_to_json(most).to_string(), "1000000000000000.00");
    }

    #[test]
    fn a_validated_amount_becomes_whole_cents() {
        let read = |s: &str| {
            Decimal::from_str_exact(s)
                .ok()
                .and_then(Money::from_validated)
        };
        assert_eq!(read("9.990"), Some(Money(999)));
        assert_eq!(read("1000000000"), Some(Money(Money::MAX_CENTS)));
        assert_eq!(read("0.001"), None);
        assert_eq!(Money::MAX.to_string(), "1000000000");
    }
}
