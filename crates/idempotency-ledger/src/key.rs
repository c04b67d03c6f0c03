//! The `Idempotency-Key` request header, parsed once at the edge.

/// The header's name.
pub const HEADER: &str = "Idempotency-Key";
/// The longest key accepted, in characters (all keys are ASCII).
pub const MAX_LEN: usize = 255;

/// A key that passed every rule: 1..=255 printable ASCII characters, not all
/// whitespace. The RFC 8941 string form (`"abc"`) is unquoted first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a request's key was refused; the message is the problem's `detail`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No value, an empty one, only whitespace, or `""`.
    #[error("Idempotency-Key header is required")]
    Missing,
    /// The header was sent more than once.
    #[error("Idempotency-Key header must be sent only once")]
    Repeated,
    /// More than [`MAX_LEN`] characters.
    #[error("Idempotency-Key must be at most 255 characters")]
    TooLong,
    /// A byte outside printable ASCII (0x20–0x7E).
    #[error("Idempotency-Key must contain only printable ASCII characters (0x20-0x7E)")]
    NotPrintableAscii,
    /// A quoted value that is not a valid RFC 8941 string.
    #[error("Idempotency-Key is a malformed RFC 8941 string")]
    MalformedQuotedString,
}

impl IdempotencyKey {
    /// Reads the key from every value a request sent for [`HEADER`]
    /// (whatever the HTTP library, e.g. actix-web's
    /// `headers.get_all(HEADER).map(|v| v.as_bytes())`): exactly one is
    /// allowed.
    pub fn from_values<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, KeyError> {
        let mut values = values.into_iter();
        let value = values.next().ok_or(KeyError::Missing)?;
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(value)
    }

    /// Applies the rules to one header value's bytes.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        if raw.iter().any(|b| !(0x20..=0x7e).contains(b)) {
            return Err(KeyError::NotPrintableAscii);
        }
        // Only printable ASCII is left, so this cannot fail; stay total anyway.
        let text = std::str::from_utf8(raw).map_err(|_| KeyError::NotPrintableAscii)?;
        let text = text.trim_matches(' ');
        let value = if text.len() >= 2 && text.starts_with('"') && text.ends_with('"') {
            unquote_sf_string(&text[1..text.len() - 1])?
        } else {
            text.to_owned()
        };
        if value.trim().is_empty() {
            return Err(KeyError::Missing);
        }
        if value.chars().count() > MAX_LEN {
            return Err(KeyError::TooLong);
        }
        Ok(Self(value))
    }

    /// The key's value (unquoted).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The inside of an RFC 8941 sf-string: `\"` and `\\` are the only escapes,
/// and a bare `"` may not appear.
fn unquote_sf_string(inner: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(KeyError::MalformedQuotedString),
            },
            '"' => return Err(KeyError::MalformedQuotedString),
            other => out.push(other),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<String, KeyError> {
        IdempotencyKey::parse(s.as_bytes()).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn a_bare_key_is_taken_as_it_is() {
        assert_eq!(parse("order-123_ABC.x").as_deref(), Ok("order-123_ABC.x"));
    }

    #[test]
    fn an_rfc_8941_string_means_the_same_as_its_unquoted_value() {
        assert_eq!(parse("\"abc\""), parse("abc"));
        assert_eq!(parse(r#""a\"b\\c""#).as_deref(), Ok(r#"a"b\c"#));
    }

    #[test]
    fn empty_whitespace_and_empty_quoted_keys_are_missing() {
        assert_eq!(parse(""), Err(KeyError::Missing));
        assert_eq!(parse("   "), Err(KeyError::Missing));
        assert_eq!(parse("\"\""), Err(KeyError::Missing));
        assert_eq!(parse("\"  \""), Err(KeyError::Missing));
    }

    #[test]
    fn a_key_of_255_characters_is_accepted_and_256_is_too_long() {
        assert!(parse(&"k".repeat(255)).is_ok());
        assert_eq!(parse(&"k".repeat(256)), Err(KeyError::TooLong));
        assert!(parse(&format!("\"{}\"", "k".repeat(255))).is_ok());
    }

    #[test]
    fn control_and_non_ascii_bytes_are_refused() {
        assert_eq!(
            IdempotencyKey::parse(b"a\tb"),
            Err(KeyError::NotPrintableAscii)
        );
        assert_eq!(
            IdempotencyKey::parse("clé".as_bytes()),
            Err(KeyError::NotPrintableAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"a\x7fb"),
            Err(KeyError::NotPrintableAscii)
        );
    }

    #[test]
    fn a_malformed_quoted_string_is_refused() {
        assert_eq!(parse(r#""a\nb""#), Err(KeyError::MalformedQuotedString));
        assert_eq!(parse(r#""a"b""#), Err(KeyError::MalformedQuotedString));
    }

    #[test]
    fn a_header_sent_twice_is_refused_and_one_never_sent_is_missing() {
        let twice: [&[u8]; 2] = [b"a", b"a"];
        assert_eq!(IdempotencyKey::from_values(twice), Err(KeyError::Repeated));
        assert_eq!(IdempotencyKey::from_values([]), Err(KeyError::Missing));
        assert_eq!(
            IdempotencyKey::from_values([b"k".as_slice()]).map(|k| k.as_str().to_owned()),
            Ok("k".to_owned())
        );
    }

    #[test]
    fn sql_is_just_characters() {
        let key = "'; DROP TABLE users; --";
        assert_eq!(parse(key).as_deref(), Ok(key));
    }
}
