//! Domain types that cannot hold an invalid order.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::Pg;
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types;
use diesel::sqlite::Sqlite;
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

/// What was ordered: trimmed, 1..=200 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item(String);

impl Item {
    pub const MAX_CHARS: usize = 200;

    pub fn parse(raw: &str) -> Result<Self, &'static str> {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err("must not be empty");
        }
        if trimmed.chars().count() > Self::MAX_CHARS {
            return Err("must be at most 200 characters");
        }
        if trimmed.chars().any(char::is_control) {
            return Err("must not contain control characters");
        }
        Ok(Self(trimmed.to_owned()))
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

    pub fn new(n: i64) -> Result<Self, &'static str> {
        if (Self::MIN..=Self::MAX).contains(&n) {
            i32::try_from(n)
                .map(Self)
                .map_err(|_| "must be between 1 and 1000000")
        } else {
            Err("must be between 1 and 1000000")
        }
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

    pub fn from_cents(cents: i128) -> Result<Self, &'static str> {
        if cents < 0 {
            return Err("must not be negative");
        }
        if cents > i128::from(Self::MAX_CENTS) {
            return Err("must be at most 1000000000");
        }
        i64::try_from(cents)
            .map(Self)
            .map_err(|_| "must be at most 1000000000")
    }

    pub fn cents(self) -> i64 {
        self.0
    }

    /// `self × quantity`, exact: at most 10^17 cents, well inside `i64`.
    pub fn times(self, quantity: Quantity) -> Option<i64> {
        self.0.checked_mul(i64::from(quantity.get()))
    }
}

/// Writes cents as the exact decimal text of a JSON number (`1998` → `19.98`).
pub fn cents_to_json(cents: i64) -> serde_json::Number {
    let sign = if cents < 0 { "-" } else { "" };
    let abs = cents.unsigned_abs();
    serde_json::Number::from_string_unchecked(format!("{sign}{}.{:02}", abs / 100, abs % 100))
}

/// Reads the exact text of a JSON number as cents. `Err` when the value is
/// not a whole number of cents; values too large for any order saturate.
pub fn json_number_to_cents(text: &str) -> Result<i128, &'static str> {
    const NOT_CENTS: &str = "must be a whole number of cents";
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (
            &rest[..at],
            rest[at + 1..].parse::<i64>().unwrap_or(i64::MAX),
        ),
        None => (rest, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(0);
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NOT_CENTS);
    }
    let frac_len = i64::try_from(frac_part.len()).unwrap_or(i64::MAX);
    let scale = exponent.saturating_sub(frac_len).saturating_add(2);
    let saturated = if negative { i128::MIN } else { i128::MAX };
    let magnitude = if scale >= 0 {
        if digits.len() as i64 + scale > 36 {
            return Ok(saturated);
        }
        let base: i128 = digits.parse().map_err(|_| NOT_CENTS)?;
        base * 10_i128.pow(scale as u32)
    } else {
        let drop = scale.unsigned_abs() as usize;
        if drop >= digits.len() {
            return Err(NOT_CENTS);
        }
        let (kept, dropped) = digits.split_at(digits.len() - drop);
        if dropped.bytes().any(|b| b != b'0') {
            return Err(NOT_CENTS);
        }
        if kept.len() > 36 {
            return Ok(saturated);
        }
        kept.parse().map_err(|_| NOT_CENTS)?
    };
    Ok(if negative { -magnitude } else { magnitude })
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
            // Bounded by Money::MAX_CENTS × Quantity::MAX, far inside i64.
            total_price: cents_to_json(self.price.times(self.quantity).unwrap_or(i64::MAX)),
            status: self.status,
            created_at: self.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_in_whole_cents_are_read_exactly() {
        assert_eq!(json_number_to_cents("9.99"), Ok(999));
        assert_eq!(json_number_to_cents("9.990"), Ok(999));
        assert_eq!(json_number_to_cents("1e2"), Ok(10_000));
        assert_eq!(json_number_to_cents("0.1E1"), Ok(100));
        assert_eq!(json_number_to_cents("0"), Ok(0));
        assert_eq!(json_number_to_cents("-0.00"), Ok(0));
        assert_eq!(json_number_to_cents("999999999.99"), Ok(99_999_999_999));
        assert_eq!(json_number_to_cents("-5"), Ok(-500));
    }

    #[test]
    fn fractions_of_a_cent_are_refused() {
        assert!(json_number_to_cents("9.999").is_err());
        assert!(json_number_to_cents("0.001").is_err());
        assert!(json_number_to_cents("1e-3").is_err());
        assert!(json_number_to_cents("1.005").is_err());
    }

    #[test]
    fn absurdly_large_prices_saturate_instead_of_overflowing() {
        assert_eq!(json_number_to_cents("1e400"), Ok(i128::MAX));
        assert_eq!(json_number_to_cents(&"9".repeat(80)), Ok(i128::MAX));
        assert!(Money::from_cents(i128::MAX).is_err());
    }

    #[test]
    fn money_is_written_as_its_exact_decimal() {
        assert_eq!(cents_to_json(30).to_string(), "0.30");
        assert_eq!(cents_to_json(1998).to_string(), "19.98");
        let total = Money::from_cents(99_999_999_999)
            .ok()
            .and_then(|m| m.times(Quantity::new(999_999).ok()?));
        assert_eq!(
            total.map(|c| cents_to_json(c).to_string()).as_deref(),
            Some("999998999990000.01")
        );
    }

    #[test]
    fn quantity_bounds_are_inclusive() {
        assert!(Quantity::new(1).is_ok());
        assert!(Quantity::new(1_000_000).is_ok());
        assert!(Quantity::new(0).is_err());
        assert!(Quantity::new(-1).is_err());
        assert!(Quantity::new(1_000_001).is_err());
    }

    #[test]
    fn items_are_trimmed_and_bounded() {
        assert_eq!(
            Item::parse("  Widget ").map(|i| i.as_str().to_owned()),
            Ok("Widget".to_owned())
        );
        assert!(Item::parse("   ").is_err());
        assert!(Item::parse(&"é".repeat(200)).is_ok());
        assert!(Item::parse(&"é".repeat(201)).is_err());
        assert!(Item::parse("a\u{0}b").is_err());
    }
}
