//! Request bodies of the orders routes, turned into domain values.
//!
//! Each member's JSON *type* is checked strictly here (a quantity is an
//! integer literal, a price a number in whole cents); its bounds are the
//! domain types' own ([`Item::parse`], [`Quantity::new`],
//! [`Money::from_cents`]), which say what is wrong. Every failing field is
//! reported, not only the first.

use serde_json::Value;

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
    let item = member(members, "item", required, &mut errors, |v| match v {
        Value::String(s) => Item::parse(s),
        _ => Err("must be a string"),
    });
    let quantity = member(members, "quantity", required, &mut errors, |v| {
        integer_literal(v)
            .ok_or("must be an integer (no fraction, no exponent)")
            .and_then(Quantity::new)
    });
    let price = member(members, "price", required, &mut errors, |v| match v {
        Value::Number(n) => json_number_to_cents(n.as_str()).and_then(Money::from_cents),
        _ => Err("must be a number"),
    });
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

/// The member `name` read by `read`, or the first thing wrong with it (pushed
/// onto `errors`).
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
