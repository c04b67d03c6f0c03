//! When two JSON values are the same: member order, insignificant whitespace
//! and the spelling of a number (`9.99`, `9.990`, `999e-2`) do not matter,
//! anything else does. Written to compare requests (their fingerprints)
//! and answers (the executed one and its replays), never to hash.

use serde_json::Value;

/// The canonical text of `value`: members sorted by name, no whitespace,
/// strings as JSON writes them, each number as its exact value
/// (`9.990` reads `999e-2`). Two values have the same text exactly when they are the
/// same JSON document up to member order and number spelling.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(&n.to_string())),
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            // Sorted here, whatever order the map keeps.
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(name, out);
                out.push(':');
                write(member, out);
            }
            out.push('}');
        }
    }
}

fn string(s: &str, out: &mut String) {
    // Serializing a string cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// A JSON number literal as its exact value: `[-]DIGITSeEXPONENT`, its
/// significant digits without leading or trailing zeros (`0` for zero, of
/// either sign), so that `9.99`, `9.990` and `999e-2` all read `999e-2`.
/// A literal whose exponent does not fit in an `i128` is kept as written:
/// still equal to itself, and never to a different value.
pub fn number(literal: &str) -> String {
    let (negative, unsigned) = match literal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, literal),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let well_formed = !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && fraction.bytes().all(|b| b.is_ascii_digit());
    let Some(exponent) = exponent
        .parse::<i128>()
        .ok()
        .filter(|_| well_formed)
        .and_then(|e| e.checked_sub(i128::try_from(fraction.len()).ok()?))
    else {
        return literal.to_owned();
    };
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return "0".to_owned();
    }
    let Some(exponent) = i128::try_from(significant.len() - trimmed.len())
        .ok()
        .and_then(|zeros| exponent.checked_add(zeros))
    else {
        return literal.to_owned();
    };
    let sign = if negative { "-" } else { "" };
    format!("{sign}{trimmed}e{exponent}")
}

/// An order id as a path names it: a string as it is, a number by its
/// value, anything else as its canonical text.
pub fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => canonical(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn a_number_is_its_value_whatever_its_spelling() {
        for same in ["9.99", "9.990", "999e-2", "0.999E1", "00009.99", "9.99e0"] {
            assert_eq!(number(same), "999e-2", "{same}");
        }
        assert_eq!(number("100"), "1e2");
        assert_eq!(number("1e2"), "1e2");
        assert_eq!(number("0"), "0");
        assert_eq!(number("-0.000"), "0");
        assert_eq!(number("-3.5"), "-35e-1");
        assert_ne!(number("9.99"), number("9.991"));
    }

    #[test]
    fn a_number_beyond_any_exponent_is_kept_as_written_and_never_panics() {
        let huge = "1e99999999999999999999999999999999999999999";
        assert_eq!(number(huge), huge);
        assert_eq!(
            number("1e170141183460469231731687303715884105727"),
            "1e170141183460469231731687303715884105727"
        );
        for odd in ["", "-", "e", ".", "1.", ".5", "1e", "--1", "1e+", "١"] {
            let _ = number(odd);
        }
    }

    #[test]
    fn member_order_whitespace_and_number_spelling_do_not_matter_and_values_do() {
        let a = json(r#"{"item": "pen", "quantity": 2, "price": 3.50}"#);
        let b = json(r#"{"price":3.5,"quantity":2.0,"item":"pen"}"#);
        assert_eq!(canonical(&a), canonical(&b));
        let c = json(r#"{"item": "pen", "quantity": 3, "price": 3.5}"#);
        assert_ne!(canonical(&a), canonical(&c));
        assert_ne!(canonical(&json(r#""2""#)), canonical(&json("2")));
        assert_eq!(
            canonical(&json(r#"[1, {"b": [true, null], "a": "x"}]"#)),
            r#"[1e0,{"a":"x","b":[true,null]}]"#
        );
    }

    #[test]
    fn an_id_is_its_text_or_its_value() {
        assert_eq!(id_text(&json(r#""0193-abc""#)), "0193-abc");
        assert_eq!(id_text(&json("17")), id_text(&json("17.0")));
    }
}
