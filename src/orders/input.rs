//! Request bodies of the orders routes, turned into domain values.
//!
//! Parsing happens in two steps: first each member's JSON *type* is checked
//! strictly (a quantity is an integer literal, a price a number in whole
//! cents), then `validator` checks the bounds of what was read. Every failing
//! field is reported, not only the first.

use serde_json::Value;
use validator::{Validate, ValidationErrors};

use super::model::{Item, Money, Quantity, json_number_to_cents};

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

/// The bounds, checked once the JSON types are right.
#[derive(Debug, Default, Validate)]
struct Bounds {
    #[validate(length(
        min = 1,
        max = 200,
        message = "must be 1 to 200 characters after trimming"
    ))]
    item: Option<String>,
    #[validate(range(min = 1, max = 1_000_000, message = "must be between 1 and 1000000"))]
    quantity: Option<i64>,
    #[validate(range(
        min = 0,
        max = 100_000_000_000_i128,
        message = "must be between 0 and 1000000000"
    ))]
    price: Option<i128>,
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
    Ok(OrderPatch {
        item: fields.item,
        quantity: fields.quantity,
        price: fields.price,
    })
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

    let mut bounds = Bounds::default();
    let present = |name: &str, errors: &mut Vec<FieldError>| -> Option<Value> {
        match members.get(name) {
            Some(v) => Some(v.clone()),
            None if required => {
                errors.push(FieldError::new(name, "is required"));
                None
            }
            None => None,
        }
    };
    if let Some(v) = present("item", &mut errors) {
        match v {
            Value::String(s) => bounds.item = Some(s.trim().to_owned()),
            _ => errors.push(FieldError::new("item", "must be a string")),
        }
    }
    if let Some(v) = present("quantity", &mut errors) {
        match integer_literal(&v) {
            Some(n) => bounds.quantity = Some(n),
            None => errors.push(FieldError::new(
                "quantity",
                "must be an integer (no fraction, no exponent)",
            )),
        }
    }
    if let Some(v) = present("price", &mut errors) {
        match &v {
            Value::Number(n) => match json_number_to_cents(n.as_str()) {
                Ok(cents) => bounds.price = Some(cents),
                Err(message) => errors.push(FieldError::new("price", message)),
            },
            _ => errors.push(FieldError::new("price", "must be a number")),
        }
    }
    if let Err(e) = bounds.validate() {
        errors.extend(field_errors(&e));
    }

    // Bounds passed for every field that is still unreported.
    let reported = |name: &str, errors: &[FieldError]| errors.iter().any(|e| e.field == name);
    let item = match bounds.item.as_deref() {
        Some(raw) if !reported("item", &errors) => match Item::parse(raw) {
            Ok(item) => Some(item),
            Err(message) => {
                errors.push(FieldError::new("item", message));
                None
            }
        },
        _ => None,
    };
    let quantity = bounds
        .quantity
        .filter(|_| !reported("quantity", &errors))
        .and_then(|n| Quantity::new(n).ok());
    let price = bounds
        .price
        .filter(|_| !reported("price", &errors))
        .and_then(|c| Money::from_cents(c).ok());

    if errors.is_empty() {
        Ok(OrderPatch {
            item,
            quantity,
            price,
        })
    } else {
        Err(errors)
    }
}

/// A JSON integer literal: digits only, no fraction and no exponent
/// (`1.0` and `1e2` are numbers, not integer literals). Values beyond `i64`
/// saturate so that they fail the range check rather than the type check.
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

fn field_errors(errors: &ValidationErrors) -> Vec<FieldError> {
    let mut out: Vec<FieldError> = errors
        .field_errors()
        .iter()
        .flat_map(|(field, list)| {
            list.iter().map(move |e| FieldError {
                field: field.to_string(),
                message: e.message.as_deref().unwrap_or("is invalid").to_owned(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.field.cmp(&b.field));
    out
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
        assert!(patch.item.is_none() && patch.quantity.is_none());
    }
}
