//! What makes two requests "the same request": method, path and body.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use json_number::{Exponent, Scientific};

/// SHA-256 over the method, the path and the body's canonical form, as
/// lowercase hex. A JSON body is canonicalised ([`canonical_json`]): member
/// order, insignificant whitespace and number spelling such as `9.990` do
/// not matter, and any changed value does; any other body is hashed as raw
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of a request: its method, its path, and its body —
    /// in its canonical form when it is JSON ([`canonical_json`] accepts
    /// it), else as raw bytes (an empty body among them).
    pub fn of(method: &str, path: &str, body: &[u8]) -> Self {
        match canonical_json(body) {
            Ok(canonical) => Self::of_canonical(method, path, &canonical),
            Err(_) => Self::of_raw(method, path, body),
        }
    }

    /// The fingerprint of a JSON body already in its canonical form (what
    /// [`canonical_json`] returned for it).
    pub fn of_canonical(method: &str, path: &str, canonical: &[u8]) -> Self {
        Self::hash(method, path, b"json:", canonical)
    }

    /// The fingerprint of a body that is not JSON, hashed as its bytes.
    pub fn of_raw(method: &str, path: &str, body: &[u8]) -> Self {
        Self::hash(method, path, b"raw:", body)
    }

    fn hash(method: &str, path: &str, kind: &[u8], body: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update([0]);
        hasher.update(path.as_bytes());
        hasher.update([0]);
        hasher.update(kind);
        hasher.update(body);
        Self(hex::encode(hasher.finalize()))
    }

    /// The fingerprint as 64 lowercase hex digits, as the ledger stores it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Reads a JSON document strictly and returns its canonical form: RFC 8785
/// (JCS) with exact numbers. Refused, with `serde_json`'s error (its
/// position in the document included): anything that is not one JSON
/// value, and an object that names a member twice, at any depth (the
/// message says which).
///
/// Members are sorted by UTF-16 code units and strings escaped as JCS does.
/// A number is read from its literal text — whatever features the
/// application's `serde_json` has — and written as JCS writes it (the
/// shortest text of the nearest `f64`) when that text denotes exactly the
/// literal's value, which keeps every such document's form byte-identical
/// to `serde_json_canonicalizer`'s; any other number (beyond `f64`'s range
/// or precision, where JCS would merge distinct values or fail) is written
/// as its exact significant digits and power of ten, `digitsE±exponent`, a
/// spelling JCS never produces. Equal values give equal text, distinct
/// values distinct text (an exponent too long for `i128` is kept as
/// written).
pub fn canonical_json(body: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let mut writer = Writer {
        out: Vec::with_capacity(body.len()),
        whole: body,
        failed: None,
        depth: 1,
    };
    let mut reader = serde_json::Deserializer::from_slice(body);
    let first = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\n' | b'\r' | b'\t'))
        .copied();
    let read = match first {
        Some(OBJECT_START) => reader.deserialize_map(Canonical(&mut writer)),
        Some(ARRAY_START) => reader.deserialize_seq(Canonical(&mut writer)),
        _ => {
            <&RawValue>::deserialize(&mut reader).and_then(|raw| scalar(raw.get(), &mut writer.out))
        }
    };
    match (read, writer.failed) {
        // Found inside a part, placed in the whole document already.
        (Err(_), Some(message)) => Err(de::Error::custom(message)),
        (Err(e), None) => Err(e),
        (Ok(()), _) => reader.end().map(|()| writer.out),
    }
}

/// The canonical form being written, and the first error found inside a
/// part of the document, placed where it is in the whole.
struct Writer<'w> {
    out: Vec<u8>,
    whole: &'w [u8],
    failed: Option<String>,
    /// How many objects and arrays enclose the part being written.
    depth: usize,
}

/// An object's opening brace, the byte an object's text starts with
/// (named, like its closing one, so that no brace appears as a character
/// in the code that reads and writes the structure).
const OBJECT_START: u8 = 0x7b;
/// An object's closing brace.
const OBJECT_END: u8 = 0x7d;
/// An array's opening bracket.
const ARRAY_START: u8 = b'[';
/// An array's closing bracket.
const ARRAY_END: u8 = b']';

/// How deep objects and arrays may nest: `serde_json`'s own limit, which
/// refuses the 128th level (each part is read by a reader of its own, so
/// the depth is counted here).
const MAX_DEPTH: usize = 128;

/// Writes the canonical form of the object or array it is handed.
struct Canonical<'a, 'w>(&'a mut Writer<'w>);

/// A member name: borrowed from the document unless it has escapes.
#[derive(PartialEq, Eq)]
struct Name<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

/// Past this many members, a name given twice is looked for in a set
/// rather than among the members read so far.
const LINEAR_NAMES: usize = 16;

impl<'de> Visitor<'de> for Canonical<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object or array")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut members: Vec<(Name<'de>, &'de RawValue)> = Vec::new();
        let mut seen: Option<HashSet<Cow<'de, str>>> = None;
        while let Some(name) = map.next_key::<Name<'de>>()? {
            let twice = match &mut seen {
                Some(seen) => !seen.insert(name.0.clone()),
                None => members.iter().any(|(n, _)| *n == name),
            };
            if twice {
                return Err(de::Error::custom(format!(
                    "duplicate member name \"{}\"",
                    name.0
                )));
            }
            if seen.is_none() && members.len() == LINEAR_NAMES {
                let mut set: HashSet<Cow<'de, str>> =
                    members.iter().map(|(n, _)| n.0.clone()).collect();
                set.insert(name.0.clone());
                seen = Some(set);
            }
            let value = map.next_value::<&'de RawValue>()?;
            members.push((name, value));
        }
        // By UTF-16 code units, compared as they are produced (member
        // names are distinct, so the order is total).
        members.sort_unstable_by(|a, b| a.0.0.encode_utf16().cmp(b.0.0.encode_utf16()));
        let writer = self.0;
        writer.out.push(OBJECT_START);
        for (i, (name, value)) in members.into_iter().enumerate() {
            if i > 0 {
                writer.out.push(b',');
            }
            string(&name.0, &mut writer.out);
            writer.out.push(b':');
            part(value, writer)?;
        }
        writer.out.push(OBJECT_END);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let writer = self.0;
        writer.out.push(ARRAY_START);
        let mut first = true;
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if !first {
                writer.out.push(b',');
            }
            first = false;
            part(item, writer)?;
        }
        writer.out.push(ARRAY_END);
        Ok(())
    }
}

/// Writes one value of an object or array (the parser checked its syntax
/// already). An object or array is read again on its own; a member named
/// twice inside it is kept in `writer.failed`, placed where it is in the
/// whole document — where a one-pass reading of the whole reports it.
fn part<E: de::Error>(raw: &RawValue, writer: &mut Writer<'_>) -> Result<(), E> {
    let text = raw.get();
    let nested = matches!(text.as_bytes().first(), Some(&(OBJECT_START | ARRAY_START)));
    if nested && writer.depth + 1 >= MAX_DEPTH {
        if writer.failed.is_none() {
            // Where serde_json reports it: just past the opening bracket.
            let at = offset_in(text, writer.whole).saturating_add(1);
            writer.failed = Some(format!(
                "recursion limit exceeded at {}",
                position(writer.whole, at)
            ));
        }
        return Err(E::custom("nested too deep"));
    }
    writer.depth += 1;
    let read = match text.as_bytes().first() {
        Some(&OBJECT_START) => {
            serde_json::Deserializer::from_str(text).deserialize_map(Canonical(writer))
        }
        Some(&ARRAY_START) => {
            serde_json::Deserializer::from_str(text).deserialize_seq(Canonical(writer))
        }
        _ => scalar(text, &mut writer.out),
    };
    writer.depth -= 1;
    read.map_err(|e| {
        if writer.failed.is_none() {
            writer.failed = Some(relocate(&e, text, writer.whole));
        }
        E::custom("an error inside a part of the document")
    })
}

/// `error`, found at a line and column of `part` (a slice of `whole`), as
/// the same message at its line and column in `whole`.
fn relocate(error: &serde_json::Error, part: &str, whole: &[u8]) -> String {
    let message = error.to_string();
    if error.line() == 0 {
        return message;
    }
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    let bare = message.strip_suffix(&suffix).unwrap_or(&message);
    // The index in the part (serde_json's column counts the bytes since
    // the line's start), then in the whole.
    let line_start = match error.line() {
        0 | 1 => 0,
        n => part
            .bytes()
            .enumerate()
            .filter(|(_, b)| *b == b'\n')
            .nth(n - 2)
            .map_or(0, |(i, _)| i + 1),
    };
    let index = offset_in(part, whole)
        .saturating_add(line_start)
        .saturating_add(error.column());
    format!("{bare} at {}", position(whole, index))
}

/// Where `part` (a slice of `whole`) starts in `whole`.
fn offset_in(part: &str, whole: &[u8]) -> usize {
    (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize)
}

/// `line L column C` of an index of `whole`, as `serde_json` counts them
/// (the column is the number of bytes since the line's start).
fn position(whole: &[u8], index: usize) -> String {
    let before = &whole[..index.min(whole.len())];
    let start_of_line = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let line = 1 + before[..start_of_line]
        .iter()
        .filter(|b| **b == b'\n')
        .count();
    format!("line {line} column {}", before.len() - start_of_line)
}

/// A string, number or literal, from its text.
fn scalar(text: &str, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match text.as_bytes().first() {
        // Without an escape, a JSON string's text is its JCS form already:
        // it holds no quote, backslash or control character.
        Some(b'"') if !text.contains('\\') => out.extend_from_slice(text.as_bytes()),
        Some(b'"') => string(&serde_json::from_str::<String>(text)?, out),
        Some(b't' | b'f' | b'n') => out.extend_from_slice(text.as_bytes()),
        _ => number_into(text, out),
    }
    Ok(())
}

/// A JSON string as JCS writes it; serde_json escapes exactly the same
/// characters the same way (`\"`, `\\`, `\b\f\n\r\t`, other controls as
/// `\u00xx`).
fn string(s: &str, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Writes a number as [`number`] does. An integer literal of at most 15
/// digits is written as it is (`-0` as `0`): every such value is an exact
/// `f64`, which JCS writes as its plain digits — the general way's answer,
/// without the float round trip.
fn number_into(text: &str, out: &mut Vec<u8>) {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let plain = (1..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !plain {
        out.extend_from_slice(number(text).as_bytes());
    } else if digits == "0" {
        out.push(b'0');
    } else {
        out.extend_from_slice(text.as_bytes());
    }
}

fn number(text: &str) -> String {
    let Some(exact) = Scientific::read(text) else {
        // Not reachable from serde_json, which only hands over number grammar.
        return format!("raw:{text}");
    };
    let jcs = text
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| ryu_js::Buffer::new().format_finite(f).to_owned());
    if let Some(jcs) = jcs
        && Scientific::read(&jcs).is_some_and(|j| same_value(&j, &exact))
    {
        return jcs;
    }
    if exact.is_zero() {
        return "0".to_owned();
    }
    let sign = if exact.negative { "-" } else { "" };
    match exact.exponent {
        Exponent::Small(e) => format!("{sign}{}E{e:+}", exact.digits),
        Exponent::Huge {
            negative,
            written,
            shift,
        } => {
            let e_sign = if negative { '-' } else { '+' };
            format!("{sign}{}E{e_sign}{written}{shift:+}", exact.digits)
        }
    }
}

fn same_value(a: &Scientific<'_>, b: &Scientific<'_>) -> bool {
    (a.is_zero() && b.is_zero()) || a == b
}

/// The canonical form as it was computed from a parsed `serde_json::Value`
/// (with `arbitrary_precision`, whose numbers keep their text): the
/// reference [`canonical_json`] must agree with byte for byte, so that
/// fingerprints stored before stay what they were.
#[cfg(any(test, feature = "invariants"))]
pub fn canonical_value(value: &serde_json::Value) -> Vec<u8> {
    use serde_json::Value;
    fn write(value: &Value, out: &mut Vec<u8>) {
        match value {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::Number(n) => number_into(n.as_str(), out),
            Value::String(s) => string(s, out),
            Value::Array(items) => {
                out.push(ARRAY_START);
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(item, out);
                }
                out.push(ARRAY_END);
            }
            Value::Object(members) => {
                let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
                sorted.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                out.push(OBJECT_START);
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    string(k, out);
                    out.push(b':');
                    write(v, out);
                }
                out.push(OBJECT_END);
            }
        }
    }
    let mut out = Vec::new();
    write(value, &mut out);
    out
}

#[cfg(test)]
mod tests;
