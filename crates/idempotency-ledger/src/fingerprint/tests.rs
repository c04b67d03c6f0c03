//! The fingerprint's and the canonical form's own tests.

use super::*;

fn json_fp(method: &str, path: &str, body: &str) -> Fingerprint {
    assert!(canonical_json(body.as_bytes()).is_ok(), "{body}");
    Fingerprint::of(method, path, body.as_bytes())
}

fn canonical(text: &str) -> String {
    String::from_utf8(canonical_json(text.as_bytes()).unwrap()).unwrap()
}

/// The fingerprint is SHA-256 of `method\0path\0json:` and the body's
/// canonical form (`raw:` and the bytes for a body that is not JSON): each
/// case states the preimage its body must give, and its expected digest is
/// computed here with `sha2` itself, never by the code under test. The
/// server pins the digests of the entries it has stored.
#[test]
fn a_fingerprint_is_the_sha256_of_its_documented_preimage() {
    for (method, path, body, preimage) in [
        (
            "POST",
            "/v1/payments",
            r#"{"payee":"Acme","amount":9.99,"count":2}"#,
            r#"json:{"amount":9.99,"count":2,"payee":"Acme"}"#,
        ),
        (
            "PATCH",
            "/v1/payments/0193a8e4-8f3c-7cc2-9d6a-5b1f2e3d4c5b",
            r#"{ "count": 3, "amount": 1e2 }"#,
            r#"json:{"amount":100,"count":3}"#,
        ),
        (
            "POST",
            "/v1/payments",
            r#"{"\u20ac":[1.50,-0,1e400,9007199254740993,0.1e-7],"\r":{"b":null,"a":true},"1":"\u0001\"/"}"#,
            r#"json:{"\r":{"a":true,"b":null},"1":"\u0001\"/","€":[1.5,0,1E+400,9007199254740993E+0,1e-8]}"#,
        ),
        ("DELETE", "/v1/payments/x", "", "raw:"),
        ("POST", "/p", "a=1&b=2", "raw:a=1&b=2"),
    ] {
        let json = preimage.starts_with("json:");
        assert_eq!(canonical_json(body.as_bytes()).is_ok(), json, "{body}");
        let mut hasher = Sha256::new();
        hasher.update(format!("{method}\0{path}\0{preimage}"));
        let expected = hex::encode(hasher.finalize());
        let got = Fingerprint::of(method, path, body.as_bytes());
        assert_eq!(got.as_str(), expected, "{method} {path} {body}");
    }
}

#[test]
fn short_integers_are_written_as_the_general_way_writes_them() {
    let mut cases: Vec<String> = [
        "0",
        "-0",
        "7",
        "-7",
        "10",
        "999999999999999",
        "-999999999999999",
    ]
    .map(String::from)
    .to_vec();
    let mut n: u64 = 1;
    for _ in 0..15 {
        cases.push(n.to_string());
        cases.push(format!("-{}", n * 7 + 3));
        n = n.saturating_mul(10);
    }
    for text in cases {
        let mut out = Vec::new();
        number_into(&text, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), number(&text), "{text}");
    }
}

#[test]
fn member_order_and_whitespace_do_not_change_the_fingerprint() {
    let a = json_fp(
        "POST",
        "/v1/payments",
        r#"{"item":"W","quantity":2,"price":9.99}"#,
    );
    let b = json_fp(
        "POST",
        "/v1/payments",
        "{ \"price\": 9.990,\n \"quantity\": 2, \"item\": \"W\" }",
    );
    assert_eq!(a, b);
}

#[test]
fn a_changed_value_method_or_path_changes_the_fingerprint() {
    let base = json_fp("POST", "/v1/payments", r#"{"quantity":2}"#);
    assert_ne!(base, json_fp("POST", "/v1/payments", r#"{"quantity":99}"#));
    assert_ne!(base, json_fp("PATCH", "/v1/payments", r#"{"quantity":2}"#));
    assert_ne!(base, json_fp("POST", "/v1/payments/x", r#"{"quantity":2}"#));
}

#[test]
fn a_non_json_body_is_hashed_as_raw_bytes() {
    let a = Fingerprint::of("POST", "/p", b"a=1&b=2");
    let b = Fingerprint::of("POST", "/p", b"b=2&a=1");
    assert_ne!(a, b);
    assert_eq!(a, Fingerprint::of_raw("POST", "/p", b"a=1&b=2"));
    assert_eq!(a.as_str().len(), 64);
}

#[test]
fn numbers_beyond_f64_are_canonical_and_exact() {
    // JCS cannot write these (the body used to be hashed raw, so
    // whitespace changed the fingerprint) or merges distinct values.
    let free = json_fp(
        "POST",
        "/v1/payments",
        r#"{"price":1e99999999999999999999}"#,
    );
    let spaced = json_fp(
        "POST",
        "/v1/payments",
        "{ \"price\" : 1E+99999999999999999999 }",
    );
    assert_eq!(free, spaced);
    assert_eq!(
        json_fp("POST", "/v1/payments", r#"{"price":1e400}"#),
        json_fp("POST", "/v1/payments", r#"{"price": 10e399}"#)
    );
    assert_ne!(
        json_fp("POST", "/v1/payments", r#"{"price":1e400}"#),
        json_fp("POST", "/v1/payments", r#"{"price":1e401}"#)
    );
    assert_ne!(
        json_fp("POST", "/v1/payments", r#"{"price":9.99}"#),
        json_fp(
            "POST",
            "/v1/payments",
            r#"{"price":9.990000000000000000001}"#
        )
    );
    assert_ne!(
        json_fp("POST", "/v1/payments", r#"{"q":9007199254740993}"#),
        json_fp("POST", "/v1/payments", r#"{"q":9007199254740992}"#)
    );
    assert_eq!(
        canonical(
            r#"[1e-400,-0,0e999999999999999999999,12.50e1,1e-99999999999999999999999999999999999999999]"#
        ),
        "[1E-400,0,0,125,1E-99999999999999999999999999999999999999999+0]"
    );
}

#[test]
fn where_jcs_is_exact_the_canonical_form_is_jcs_byte_for_byte() {
    let text = r#"{"\u20ac":1,"\r":2,"1":3,"b":1.50,"a":1e2,"s":"\u0001\"\\/\u007f","n":[null,true,-0.0,1e21,5e-7]}"#;
    let value: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let jcs = serde_json_canonicalizer::to_vec(&value).unwrap_or_default();
    assert_eq!(canonical_json(text.as_bytes()).unwrap(), jcs);
}

#[test]
fn the_canonical_form_follows_rfc_8785() {
    // RFC 8785 §3.2.3 sorts members by UTF-16 code units and writes numbers as ES6 does.
    let value: serde_json::Value =
        serde_json::from_str(r#"{"\u20ac":1,"\r":2,"1":3,"b":1.50,"a":1e2}"#).unwrap_or_default();
    let canonical = serde_json_canonicalizer::to_string(&value).unwrap_or_default();
    assert_eq!(canonical, "{\"\\r\":2,\"1\":3,\"a\":100,\"b\":1.5,\"€\":1}");
}

/// Documents the strict reading refuses: nothing, an object never closed,
/// a member without a value, no JSON, text after the value, a trailing
/// comma, an unknown escape.
const NOT_ONE_JSON_VALUE: [&str; 7] = [
    "",
    "{",
    "{\"a\":}",
    "nope",
    "{} trailing",
    "[1,]",
    "\"\\x\"",
];

/// The strict reading's refusals, worded and placed as `serde_json`'s
/// one pass over the whole document words and places them.
#[test]
fn a_member_named_twice_is_refused_where_it_is_at_any_depth() {
    let refused = |text: &str| canonical_json(text.as_bytes()).map_err(|e| e.to_string());
    assert_eq!(
        refused(r#"{"a":1,"a":2}"#),
        Err(r#"duplicate member name "a" at line 1 column 10"#.to_owned())
    );
    assert_eq!(
        refused("{\"x\": [1, {\"b\": 1,\n  \"b\": 1}]}"),
        Err(r#"duplicate member name "b" at line 2 column 5"#.to_owned())
    );
    assert!(refused(r#"[{"b":1},{"b":1}]"#).is_ok());
    let many: Vec<String> = (0..40).map(|i| format!("\"m{i}\":{i}")).collect();
    assert!(refused(&format!("{{{}}}", many.join(","))).is_ok());
    assert!(refused(&format!("{{{},\"m7\":0}}", many.join(","))).is_err());
    // Nesting: refused at the depth, and where, serde_json refuses it.
    for (depth, open, close) in [(127, "[", "]"), (128, "[", "]"), (300, "{\"a\":", "}")] {
        let text = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let value = serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string());
        assert_eq!(refused(&text).map(drop), value.map(drop), "depth {depth}");
    }
    for bad in NOT_ONE_JSON_VALUE {
        assert!(refused(bad).is_err(), "{bad}");
    }
}

/// The canonical form as it was computed: from the `Value` parsed
/// with `arbitrary_precision` (a name given twice keeps its last value).
fn one_pass(text: &str) -> Result<Vec<u8>, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(canonical_value(&value))
}

mod generated {
    use proptest::prelude::*;

    use super::super::*;

    /// A JSON number literal of any spelling: sign, leading digits,
    /// fraction, exponent of either case and sign, large and tiny.
    fn number() -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            prop_oneof![Just("0".to_owned()), "[1-9][0-9]{0,25}"],
            proptest::option::of("[0-9]{1,25}"),
            proptest::option::of((
                prop_oneof![Just("e"), Just("E")],
                prop_oneof![Just(""), Just("+"), Just("-")],
                "[0-9]{1,24}",
            )),
        )
            .prop_map(|(neg, int, frac, exp)| {
                let mut s = String::new();
                if neg {
                    s.push('-');
                }
                s.push_str(&int);
                if let Some(f) = frac {
                    s.push('.');
                    s.push_str(&f);
                }
                if let Some((e, sign, digits)) = exp {
                    s.push_str(e);
                    s.push_str(sign);
                    s.push_str(&digits);
                }
                s
            })
    }

    /// A JSON string literal with escapes, controls and non-ASCII.
    fn string_literal() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                "[a-zA-Z0-9 ]",
                Just("\\\"".to_owned()),
                Just("\\\\".to_owned()),
                Just("\\/".to_owned()),
                Just("\\n".to_owned()),
                Just("\\u0001".to_owned()),
                Just("\\u20ac".to_owned()),
                Just("\\ud83d\\ude00".to_owned()),
                Just("\u{e9}".to_owned()),
                Just("\u{1f600}".to_owned()),
                Just("\u{7f}".to_owned()),
            ],
            0..6,
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat()))
    }

    /// Any JSON document's text, with whitespace between tokens.
    fn document() -> impl Strategy<Value = String> {
        let ws = prop_oneof![Just(""), Just(" "), Just("\n "), Just("\t")];
        let leaf = prop_oneof![
            number(),
            string_literal(),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("null".to_owned()),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            let ws = ws.clone();
            prop_oneof![
                proptest::collection::vec((inner.clone(), ws.clone()), 0..6).prop_map(|items| {
                    let items: Vec<String> = items
                        .into_iter()
                        .map(|(v, w)| format!("{w}{v}{w}"))
                        .collect();
                    format!("[{}]", items.join(","))
                }),
                proptest::collection::vec((string_literal(), inner, ws), 0..6).prop_map(
                    |members| {
                        let members: Vec<String> = members
                            .into_iter()
                            .map(|(k, v, w)| format!("{w}{k}{w}:{w}{v}{w}"))
                            .collect();
                        format!("{{{}}}", members.join(","))
                    }
                ),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Stored entries hold fingerprints computed from a parsed
        /// `Value` with `arbitrary_precision`: the canonical form read
        /// from the text is that one, byte for byte, for any document
        /// (names given twice aside: both refuse those).
        #[test]
        fn the_canonical_form_from_the_text_is_the_one_from_the_parsed_value(text in document()) {
            let from_text = canonical_json(text.as_bytes()).map_err(|e| e.to_string());
            let from_value = super::one_pass(&text);
            match (&from_text, &from_value) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{}", text),
                // A name given twice: the value keeps the last one.
                (Err(e), Ok(_)) => prop_assert!(e.starts_with("duplicate member name"), "{}: {}", text, e),
                (_, Err(e)) => prop_assert!(false, "{} does not parse: {}", text, e),
            }
        }
    }
}
