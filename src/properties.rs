//! Property tests (proptest) of everything that reads client input: the
//! `Idempotency-Key` parser, the request fingerprint, the order body parser
//! with its money arithmetic, the list cursor, and the body's media type.
//!
//! Numbers are generated as *text*, never as floats: signs, leading zeros,
//! mantissas of 0–400 digits, exponents of up to 20 digits, then checked
//! against the invariants of [`crate::invariants`] (the fuzz targets' own).
//!
//! Each property runs [`CASES`] generated cases, fixed here so that CI runs
//! the same amount of work every time (`PROPTEST_CASES` does not change it).

use proptest::prelude::*;
use serde_json::Value;

use crate::http::body::is_json_media_type;
use crate::orders::Cursor;
use crate::orders::input::{FieldError, parse_new_order};
use crate::orders::model::{Money, cents_to_json};
use idempotency_ledger::{Fingerprint, IdempotencyKey, KeyError, MAX_LEN};

/// Cases per property.
const CASES: u32 = 1_000;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        // A failure is reported with its minimal case; nothing is written
        // into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Any JSON value whose numbers a canonicaliser can write (within `f64`),
/// nested a few levels deep.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1_i64 << 53)..(1_i64 << 53)).prop_map(Value::from),
        (-1.0e9_f64..1.0e9)
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `value` as JSON text with its members in another order (rotated by
/// `seed`) and whitespace wherever JSON allows it.
fn reshuffled(value: &Value, seed: usize) -> String {
    const SPACE: [&str; 4] = ["", " ", "\n  ", "\t"];
    let ws = |i: usize| SPACE[(seed + i) % SPACE.len()];
    match value {
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(|v| reshuffled(v, seed + 1)).collect();
            format!("[{}{}{}]", ws(0), inner.join(&format!(",{}", ws(1))), ws(2))
        }
        Value::Object(members) => {
            let mut members: Vec<(&String, &Value)> = members.iter().collect();
            if !members.is_empty() {
                let by = seed % members.len();
                members.rotate_left(by);
                if seed % 2 == 1 {
                    members.reverse();
                }
            }
            let inner: Vec<String> = members
                .into_iter()
                .map(|(k, v)| {
                    format!(
                        "{}{}:{}{}",
                        Value::String(k.clone()),
                        ws(3),
                        ws(1),
                        reshuffled(v, seed + 1)
                    )
                })
                .collect();
            format!(
                "{{{}{}{}}}",
                ws(1),
                inner.join(&format!("{},", ws(2))),
                ws(0)
            )
        }
        leaf => leaf.to_string(),
    }
}

/// The fingerprint the server computes for a JSON body sent as `text`.
fn fingerprint_of(text: &str) -> Fingerprint {
    let parsed: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    Fingerprint::of("POST", "/v1/orders", text.as_bytes(), Some(&parsed))
}

/// The price the server reads from a body whose `price` is `literal`.
fn price_cents(literal: &str) -> Option<i64> {
    let body: Value =
        serde_json::from_str(&format!(r#"{{"item":"w","quantity":1,"price":{literal}}}"#)).ok()?;
    parse_new_order(&body).ok().map(|o| o.price.cents())
}

/// `s` as an RFC 8941 sf-string: quoted, `"` and `\` escaped.
fn sf_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A JSON number literal as text, or something close to one: an optional
/// sign, an integer part of 0–400 digits (leading zeros included, which
/// JSON refuses), an optional fraction of up to 400 digits, an optional
/// exponent of up to 20 digits (with its own leading zeros).
fn number_literal() -> impl Strategy<Value = String> {
    let int = prop_oneof![
        Just(String::new()),
        Just("0".to_owned()),
        "[1-9][0-9]{0,12}",
        "[1-9][0-9]{0,400}",
        "10{0,400}",
        "0{1,3}[0-9]{0,3}",
    ];
    let frac = prop_oneof![
        Just(String::new()),
        "\\.[0-9]{0,4}",
        "\\.0{0,400}[0-9]{0,3}",
        "\\.[0-9]{0,400}",
    ];
    let exp = prop_oneof![
        Just(String::new()),
        (-40_i32..40).prop_map(|e| format!("e{e}")),
        "[eE][+-]?0{0,3}[0-9]{1,20}",
        "[eE][+-]?[1-9]{20}",
    ];
    ("-?", int, frac, exp).prop_map(|(sign, i, f, e)| format!("{sign}{i}{f}{e}"))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_number_literal_as_a_price_is_its_exact_value_or_refused_naming_price(literal in number_literal()) {
        crate::invariants::check_price_literal(&literal);
    }

    #[test]
    fn a_quantity_is_accepted_only_as_an_integer_literal_in_range(literal in number_literal()) {
        let body = format!(r#"{{"item":"w","quantity":{literal},"price":1}}"#);
        let Ok(value) = crate::http::body::parse_json(body.as_bytes()) else { return Ok(()) };
        let integer = !literal.contains(['.', 'e', 'E']) && literal.parse::<i64>().is_ok_and(|q| (1..=1_000_000).contains(&q));
        match parse_new_order(&value) {
            Ok(order) => {
                prop_assert!(integer, "{} accepted", literal);
                prop_assert_eq!(order.quantity.get().to_string(), literal.trim_start_matches('0'));
            }
            Err(errors) => {
                prop_assert!(!integer, "{} refused", literal);
                prop_assert_eq!(errors.len(), 1);
                prop_assert_eq!(errors[0].field.as_str(), "quantity");
            }
        }
    }

    #[test]
    fn bodies_with_such_numbers_in_every_field_name_exactly_the_failing_fields(
        item in number_literal(), quantity in number_literal(), price in number_literal(),
    ) {
        let body = format!(r#"{{"item":{item},"quantity":{quantity},"price":{price}}}"#);
        crate::invariants::check_order_body(body.as_bytes(), true);
        crate::invariants::check_order_body(body.as_bytes(), false);
        let patch = format!(r#"{{"quantity":{quantity},"price":{price}}}"#);
        crate::invariants::check_order_body(patch.as_bytes(), false);
        idempotency_ledger::invariants::check_fingerprint(body.as_bytes());
    }

    #[test]
    fn any_header_bytes_give_a_valid_key_or_a_refusal(raw in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(key) = IdempotencyKey::parse(&raw) {
            let k = key.as_str();
            prop_assert!(!k.trim().is_empty());
            prop_assert!(k.chars().count() <= MAX_LEN);
            prop_assert!(k.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        }
    }

    #[test]
    fn a_key_and_its_rfc_8941_string_form_mean_the_same(key in "[ -~]{0,260}") {
        // A header value has no surrounding whitespace, and a bare value
        // that is itself quoted is read as a string.
        let key = key.trim_matches(' ');
        prop_assume!(!(key.len() >= 2 && key.starts_with('"') && key.ends_with('"')));
        let bare = IdempotencyKey::parse(key.as_bytes());
        let quoted = IdempotencyKey::parse(sf_string(key).as_bytes());
        prop_assert_eq!(&bare, &quoted);
        if let Ok(k) = bare {
            prop_assert_eq!(k.as_str(), key);
        } else {
            prop_assert!(matches!(bare, Err(KeyError::Missing | KeyError::TooLong)), "{:?}", bare);
        }
    }

    #[test]
    fn member_order_and_whitespace_never_change_the_fingerprint(value in json(), seed in 0_usize..64) {
        let compact = value.to_string();
        let other = reshuffled(&value, seed);
        prop_assert_eq!(fingerprint_of(&compact), fingerprint_of(&other), "{} vs {}", compact, other);
    }

    #[test]
    fn any_change_of_a_value_changes_the_fingerprint(
        members in prop::collection::btree_map("[a-z]{1,6}", json(), 1..6),
        pick in any::<prop::sample::Index>(),
        replacement in json(),
    ) {
        let key = pick.get(&members.keys().cloned().collect::<Vec<_>>()).clone();
        let canonical = |v: &Value| serde_json_canonicalizer::to_string(v).ok();
        prop_assume!(canonical(&members[&key]) != canonical(&replacement));
        let before = Value::Object(members.clone().into_iter().collect());
        let mut changed = members;
        changed.insert(key, replacement);
        let after = Value::Object(changed.into_iter().collect());
        prop_assert_ne!(fingerprint_of(&before.to_string()), fingerprint_of(&after.to_string()));
    }

    #[test]
    fn the_one_pass_reading_of_a_body_is_serde_jsons_value_refusing_only_duplicates(
        value in json(),
        seed in 0_usize..64,
        duplicate in any::<bool>(),
    ) {
        let mut text = reshuffled(&value, seed);
        if duplicate && text.starts_with("{\"") {
            // The first member named again, at the end.
            let first = text[1..].split_once(':').map(|(name, _)| name.to_owned()).unwrap_or_default();
            text.insert_str(text.len() - 1, &format!(",{first}:null"));
        }
        crate::invariants::check_strict_json(text.as_bytes());
    }

    fn any_json_body_gives_an_order_or_a_list_of_failing_fields(value in json()) {
        match parse_new_order(&value) {
            Ok(order) => {
                prop_assert!(value.is_object());
                prop_assert!((1..=1_000_000).contains(&order.quantity.get()));
                prop_assert!((0..=Money::MAX_CENTS).contains(&order.price.cents()));
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                let known = ["body", "item", "quantity", "price"];
                let members = value.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
                for FieldError { field, message } in &errors {
                    prop_assert!(!message.is_empty());
                    prop_assert!(known.contains(&field.as_str()) || members.contains(field), "{}", field);
                }
            }
        }
    }

    #[test]
    fn an_order_with_members_of_any_type_is_refused_field_by_field(
        item in json(), quantity in json(), price in json(),
    ) {
        let body = serde_json::json!({"item": item, "quantity": quantity, "price": price});
        let fields: Vec<String> = match parse_new_order(&body) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.into_iter().map(|e| e.field).collect(),
        };
        prop_assert!(fields.iter().all(|f| ["item", "quantity", "price"].contains(&f.as_str())), "{:?}", fields);
        for (name, value) in [("item", &item), ("quantity", &quantity), ("price", &price)] {
            let wrong_type = if name == "item" { !value.is_string() } else { !value.is_number() };
            if wrong_type {
                prop_assert!(fields.iter().any(|f| f == name), "{} = {} not reported: {:?}", name, value, fields);
            }
        }
    }

    #[test]
    fn a_valid_order_is_read_exactly(
        item in "[a-zA-Z0-9]{1,5}( [a-zA-Z0-9]{1,5}){0,3}",
        quantity in 1_i64..=1_000_000,
        cents in 0..=Money::MAX_CENTS,
    ) {
        let body: Value = serde_json::from_str(&format!(
            r#"{{"item":" {item} ","quantity":{quantity},"price":{}}}"#,
            cents_to_json(cents)
        )).unwrap_or(Value::Null);
        let order = parse_new_order(&body);
        prop_assert!(order.is_ok(), "{:?}", order);
        if let Ok(order) = order {
            prop_assert_eq!(order.item.as_str(), item.as_str());
            prop_assert_eq!(i64::from(order.quantity.get()), quantity);
            prop_assert_eq!(order.price.cents(), cents);
        }
    }

    #[test]
    fn money_round_trips_exactly_from_cents_to_text_and_back(cents in 0..=Money::MAX_CENTS) {
        let text = cents_to_json(cents).to_string();
        prop_assert_eq!(price_cents(&text), Some(cents));
        prop_assert_eq!(text.split_once('.').map(|(_, f)| f.len()), Some(2));
    }

    #[test]
    fn money_round_trips_exactly_from_any_spelling_to_cents_and_back(
        cents in 0..=Money::MAX_CENTS, zeros in 0_usize..4, shift in 0_i32..4,
    ) {
        let canonical = cents_to_json(cents).to_string();
        // The same amount with trailing zeros, and with its point moved
        // into an exponent: 9.99, 9.990, 99.9e-1, 999e-2.
        let padded = format!("{canonical}{}", "0".repeat(zeros));
        let (units, fraction) = canonical.split_once('.').unwrap_or((&canonical, ""));
        let digits = format!("{units}{fraction}");
        let shift = usize::try_from(shift).unwrap_or(0).min(fraction.len());
        let (head, tail) = digits.split_at(digits.len() - (fraction.len() - shift));
        let exponent = if tail.is_empty() {
            format!("{head}e-{shift}")
        } else {
            format!("{head}.{tail}e-{shift}")
        };
        for spelling in [&canonical, &padded, &exponent] {
            let read = price_cents(spelling);
            prop_assert_eq!(read, Some(cents), "{}", spelling);
            let written = cents_to_json(read.unwrap_or(-1));
            prop_assert_eq!(written.to_string(), canonical.clone(), "{}", spelling);
        }
    }

    #[test]
    fn any_cursor_text_is_read_or_refused_and_issued_cursors_read_back(text in "\\PC{0,40}", hex in "[0-9a-fA-F]{32}") {
        let decoded = Cursor::decode(&text);
        prop_assert_eq!(decoded.is_some(), text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        let cursor = Cursor::decode(&hex.to_ascii_lowercase());
        prop_assert!(cursor.is_some());
        if let Some(cursor) = cursor {
            let issued = cursor.encode();
            prop_assert_eq!(&issued, &hex.to_ascii_lowercase());
            prop_assert_eq!(Cursor::decode(&issued), Some(cursor));
        }
    }

    #[test]
    fn a_media_type_reads_the_same_whatever_the_whitespace_around_its_semicolons_and_its_case(
        subtype in prop_oneof![
            Just("json".to_owned()),
            Just("JSON".to_owned()),
            Just("Json".to_owned()),
            Just("problem+json".to_owned()),
            Just("jsonx".to_owned()),
            "[a-z]{1,6}",
        ],
        params in proptest::collection::vec(("[a-zA-Z]{1,8}", "[a-zA-Z0-9-]{1,8}"), 0..3),
        before in proptest::collection::vec("[ \t]{0,2}", 3),
        after in proptest::collection::vec("[ \t]{0,2}", 3),
        noise in "\\PC{0,40}",
    ) {
        // Any text: an answer, never a panic.
        let _ = is_json_media_type(&noise);
        let tight: String = std::iter::once(format!("application/{subtype}"))
            .chain(params.iter().map(|(k, v)| format!(";{k}={v}")))
            .collect();
        let mut spaced = format!("Application/{subtype}");
        for (i, (k, v)) in params.iter().enumerate() {
            spaced.push_str(&format!("{};{}{k}={v}", before[i], after[i]));
        }
        let expected = subtype.eq_ignore_ascii_case("json");
        prop_assert_eq!(is_json_media_type(&tight), expected, "{}", tight);
        prop_assert_eq!(is_json_media_type(&spaced), expected, "{}", spaced);
    }
}
