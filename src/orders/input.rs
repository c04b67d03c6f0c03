//! Request bodies of the orders routes, turned into domain values.
//!
//! Two steps. Each member's JSON *type* is checked strictly first (a
//! quantity is an integer literal, a price a number, read exactly as
//! [`Amount`]); then the field rules, declared once on [`OrderFields`] with
//! `validator`, check the values. The domain types are built from fields
//! that passed, without checking the same bounds again. Every failing field
//! is reported, one entry each, in the order `item`, `quantity`, `price`
//! after any unknown members.

use std::borrow::Cow;

use serde_json::Value;
use validator::{Validate, ValidationError, ValidationErrors};

use super::model::{Item, Money, Quantity};
use super::money::Amount;

/// One failing field of a `422 VALIDATION_FAILED`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: &str) -> Self {
        Self {
            field: field.to_owned(),
            message: message.to_owned(),
        }
    }
}

/// The body of `POST /v1/orders`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    pub item: Item,
    pub quantity: Quantity,
    pub price: Money,
}

/// The body of `PATCH /v1/orders/{id}`: at least one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPatch {
    pub item: Option<Item>,
    pub quantity: Option<Quantity>,
    pub price: Option<Money>,
}

const FIELDS: [&str; 3] = ["item", "quantity", "price"];

/// Not a whole number of cents.
pub const NOT_CENTS: &str = "must be a whole number of cents";

/// The field rules of an order, in one place. A field that is `None` was
/// absent (or of the wrong JSON type, already reported) and is not checked.
/// Rows are written only from values that passed them; a row read back is
/// checked for the shape they give (`Item::from_stored` and its kin), not
/// run through them again.
#[derive(Debug, Clone, Default, Validate)]
pub struct OrderFields {
    /// Trimmed before the rules apply.
    #[validate(
        custom(function = "not_empty", message = "must not be empty"),
        length(max = Item::MAX_CHARS, message = "must be at most 200 characters"),
        non_control_character(message = "must not contain control characters")
    )]
    pub item: Option<String>,
    /// Integer literals beyond `i64` saturate, so they fail the range.
    #[validate(range(
        min = Quantity::MIN,
        max = Quantity::MAX,
        message = "must be between 1 and 1000000"
    ))]
    pub quantity: Option<i64>,
    #[validate(custom(function = "money_rule"))]
    pub price: Option<Amount>,
}

fn not_empty(item: &str) -> Result<(), ValidationError> {
    if item.is_empty() {
        Err(ValidationError::new("empty"))
    } else {
        Ok(())
    }
}

/// The money rule: a whole number of cents, not negative, at most
/// [`Money::MAX`] — in that order of precedence.
pub fn money_rule(amount: &Amount) -> Result<(), ValidationError> {
    let refuse =
        |code, message| Err(ValidationError::new(code).with_message(Cow::Borrowed(message)));
    let (negative, below_cents, too_large) = match *amount {
        Amount::Exact(d) => (
            d.is_sign_negative() && !d.is_zero(),
            d.normalize().scale() > 2,
            d > Money::MAX,
        ),
        // Without a digit below cents, such a value is beyond any bound.
        Amount::Beyond {
            negative,
            below_cents,
        } => (negative, below_cents, true),
    };
    if below_cents {
        refuse("cents", NOT_CENTS)
    } else if negative {
        refuse("negative", "must not be negative")
    } else if too_large {
        refuse("max", "must be at most 1000000000")
    } else {
        Ok(())
    }
}

impl OrderFields {
    /// The fields that passed every rule, as domain values; or one error
    /// per failing field.
    pub fn check(self) -> Result<OrderPatch, Vec<FieldError>> {
        if let Err(errors) = self.validate() {
            return Err(field_errors(&errors));
        }
        // The rules held, so these conversions only change representation.
        let price = match self.price {
            Some(Amount::Exact(d)) => Some(
                Money::from_validated(d)
                    .ok_or_else(|| vec![FieldError::new("price", NOT_CENTS)])?,
            ),
            Some(Amount::Beyond { .. }) => return Err(vec![FieldError::new("price", NOT_CENTS)]),
            None => None,
        };
        let quantity = match self.quantity {
            Some(q) => Some(Quantity::from_validated(q).ok_or_else(|| {
                vec![FieldError::new("quantity", "must be between 1 and 1000000")]
            })?),
            None => None,
        };
        Ok(OrderPatch {
            item: self.item.map(Item::from_validated),
            quantity,
            price,
        })
    }
}

/// `validator`'s errors as the API reports them: the first message of each
/// failing field, in [`FIELDS`] order.
fn field_errors(errors: &ValidationErrors) -> Vec<FieldError> {
    let by_field = errors.field_errors();
    FIELDS
        .iter()
        .filter_map(|name| {
            let first = by_field.get(*name)?.first()?;
            let message = first.message.as_deref().unwrap_or("is invalid");
            Some(FieldError::new(name, message))
        })
        .collect()
}

pub fn parse_new_order(body: &Value) -> Result<NewOrder, Vec<FieldError>> {
    let fields = parse_fields(body, true)?;
    match (fields.item, fields.quantity, fields.price) {
        (Some(item), Some(quantity), Some(price)) => Ok(NewOrder {
            item,
            quantity,
            price,
        }),
        // parse_fields reports missing fields when they are required.
        _ => Err(vec![FieldError::new(
            "body",
            "item, quantity and price are required",
        )]),
    }
}

pub fn parse_order_patch(body: &Value) -> Result<OrderPatch, Vec<FieldError>> {
    let fields = parse_fields(body, false)?;
    if fields.item.is_none() && fields.quantity.is_none() && fields.price.is_none() {
        return Err(vec![FieldError::new(
            "body",
            "at least one of item, quantity, price is required",
        )]);
    }
    Ok(fields)
}

fn parse_fields(body: &Value, required: bool) -> Result<OrderPatch, Vec<FieldError>> {
    let Value::Object(members) = body else {
        return Err(vec![FieldError::new("body", "must be a JSON object")]);
    };
    let mut errors: Vec<FieldError> = members
        .keys()
        .filter(|k| !FIELDS.contains(&k.as_str()))
        .map(|k| FieldError::new(k, "is not a known field"))
        .collect();
    let mut typed = Vec::new();
    let fields = OrderFields {
        item: member(members, "item", required, &mut typed, |v| match v {
            Value::String(s) => Ok(s.trim().to_owned()),
            _ => Err("must be a string"),
        }),
        quantity: member(members, "quantity", required, &mut typed, |v| {
            integer_literal(v).ok_or("must be an integer (no fraction, no exponent)")
        }),
        price: member(members, "price", required, &mut typed, |v| match v {
            Value::Number(n) => Amount::read(n.as_str()).ok_or("must be a number"),
            _ => Err("must be a number"),
        }),
    };
    let checked = fields.check();
    // Type errors and rule errors concern distinct fields; keep FIELDS order.
    let mut failing: Vec<FieldError> = typed;
    if let Err(rule_errors) = &checked {
        failing.extend(rule_errors.iter().cloned());
    }
    failing.sort_by_key(|e| FIELDS.iter().position(|f| *f == e.field));
    errors.extend(failing);
    if errors.is_empty() {
        checked
    } else {
        Err(errors)
    }
}

/// The member `name` read by `read` (its JSON type checked), or the first
/// thing wrong with it (pushed onto `errors`).
fn member<T>(
    members: &serde_json::Map<String, Value>,
    name: &str,
    required: bool,
    errors: &mut Vec<FieldError>,
    read: impl FnOnce(&Value) -> Result<T, &'static str>,
) -> Option<T> {
    let result = match members.get(name) {
        Some(value) => read(value).map(Some),
        None if required => Err("is required"),
        None => Ok(None),
    };
    result.unwrap_or_else(|message| {
        errors.push(FieldError::new(name, message));
        None
    })
}

/// A JSON integer literal: digits only, no fraction and no exponent
/// (`1.0` and `1e2` are numbers, not integer literals). Values beyond `i64`
/// saturate so that they fail the range rule rather than the type check.
fn integer_literal(v: &Value) -> Option<i64> {
    let Value::Number(n) = v else { return None };
    let text = n.as_str();
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse::<i64>().unwrap_or(if text.starts_with('-') {
        i64::MIN
    } else {
        i64::MAX
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    fn fields(result: Result<NewOrder, Vec<FieldError>>) -> Vec<String> {
        result
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn a_valid_order_is_read_exactly() {
        let order =
            parse_new_order(&body(r#"{"item":" Widget ","quantity":2,"price":9.99}"#)).unwrap();
        assert_eq!(order.item.as_str(), "Widget");
        assert_eq!(order.quantity.get(), 2);
        assert_eq!(order.price.cents(), 999);
    }

    #[test]
    fn quantities_that_are_not_integer_literals_are_refused() {
        for q in [r#""1""#, "1.5", "1.0", "1e2", "true", "null", "[1]"] {
            let text = format!(r#"{{"item":"W","quantity":{q},"price":1}}"#);
            assert_eq!(
                fields(parse_new_order(&body(&text))),
                vec!["quantity"],
                "quantity {q}"
            );
        }
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert_eq!(
            fields(parse_new_order(&body(
                r#"{"item":"W","quantity":0,"price":1}"#
            ))),
            vec!["quantity"]
        );
        assert_eq!(
            fields(parse_new_order(&body(
                r#"{"item":"W","quantity":-1,"price":1}"#
            ))),
            vec!["quantity"]
        );
        assert_eq!(
            fields(parse_new_order(&body(
                r#"{"item":"W","quantity":99999999999999999999999,"price":1}"#
            ))),
            vec!["quantity"]
        );
        assert_eq!(
            fields(parse_new_order(&body(
                r#"{"item":"W","quantity":1,"price":-0.01}"#
            ))),
            vec!["price"]
        );
        assert_eq!(
            fields(parse_new_order(&body(
                r#"{"item":"W","quantity":1,"price":1e10}"#
            ))),
            vec!["price"]
        );
        assert_eq!(
            fields(parse_new_order(&body(
                r#"{"item":"W","quantity":1,"price":9.999}"#
            ))),
            vec!["price"]
        );
    }

    #[test]
    fn a_price_of_any_exponent_is_exact_or_refused_never_free() {
        // The free order: the exponent overflowed and the price read as 0.00.
        for free in [
            "1e99999999999999999999",
            "1E+99999999999999999999",
            "1e-99999999999999999999",
            "-1e99999999999999999999",
        ] {
            let text = format!(r#"{{"item":"W","quantity":1,"price":{free}}}"#);
            assert_eq!(
                fields(parse_new_order(&body(&text))),
                vec!["price"],
                "{free}"
            );
        }
        let price = |p: &str| {
            parse_new_order(&body(&format!(
                r#"{{"item":"W","quantity":1,"price":{p}}}"#
            )))
            .map(|o| o.price.cents())
        };
        assert_eq!(price("0e99999999999999999999"), Ok(0));
        assert_eq!(
            price(&format!("1{}e-390", "0".repeat(399))),
            Ok(100_000_000_000)
        );
        assert_eq!(
            price(&format!("1{}e-391", "0".repeat(399))),
            Ok(10_000_000_000)
        );
        assert!(price(&format!("0.{}1", "0".repeat(399))).is_err());
        assert!(price(&format!("1{}", "0".repeat(400))).is_err());
    }

    #[test]
    fn the_field_rules_are_validators_one_message_per_failing_field() {
        let fields = OrderFields {
            item: Some("a\u{7}b".to_owned()),
            quantity: Some(1_000_001),
            price: Amount::read("1e-99999999999999999999"),
        };
        let errors = match fields.clone().validate() {
            Err(errors) => field_errors(&errors),
            Ok(()) => Vec::new(),
        };
        assert_eq!(
            errors,
            vec![
                FieldError::new("item", "must not contain control characters"),
                FieldError::new("quantity", "must be between 1 and 1000000"),
                FieldError::new("price", NOT_CENTS),
            ]
        );
        assert_eq!(fields.check().err(), Some(errors));
        let valid = OrderFields {
            item: Some("W".to_owned()),
            quantity: Some(1),
            price: Amount::read("1000000000"),
        };
        let order = valid.check().unwrap();
        assert_eq!(order.price.map(Money::cents), Some(Money::MAX_CENTS));
        let too_long = OrderFields {
            item: Some("x".repeat(201)),
            ..OrderFields::default()
        };
        assert_eq!(
            too_long.check().err(),
            Some(vec![FieldError::new(
                "item",
                "must be at most 200 characters"
            )])
        );
    }

    #[test]
    fn every_failing_field_is_reported() {
        let got = fields(parse_new_order(&body(r#"{"quantity":"x","extra":1}"#)));
        assert_eq!(got, vec!["extra", "item", "quantity", "price"]);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused() {
        assert_eq!(fields(parse_new_order(&json!([1, 2]))), vec!["body"]);
    }

    #[test]
    fn a_patch_needs_at_least_one_field_and_each_is_checked() {
        assert!(parse_order_patch(&json!({})).is_err());
        assert!(parse_order_patch(&body(r#"{"quantity":1.0}"#)).is_err());
        let patch = parse_order_patch(&body(r#"{"price":0.1}"#)).unwrap();
        assert_eq!(patch.price.map(Money::cents), Some(10));
        let bad = parse_order_patch(&body(r#"{"price":1e99999999999999999999}"#));
        assert_eq!(
            bad.err().map(|e| e[0].field.clone()).as_deref(),
            Some("price")
        );
        assert!(patch.item.is_none() && patch.quantity.is_none());
    }
}
