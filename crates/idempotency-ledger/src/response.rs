//! A response as the ledger records it and replays it.

/// The only response headers recorded and replayed (compared without
/// regard to case): never `Set-Cookie`, never anything about
/// authentication.
pub const RECORDED_HEADERS: [&str; 3] = ["location", "content-type", "etag"];

/// A response as the ledger stores and replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedResponse {
    /// The HTTP status (100–599).
    pub status: u16,
    /// The response's headers; only [`RECORDED_HEADERS`] are recorded.
    pub headers: Vec<(String, String)>,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

/// A stored entry that cannot be replayed as it was recorded: a row this
/// ledger did not write (a status outside 100–599, headers that are not
/// JSON pairs of a header name and a value). Never answered with a made-up
/// response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the recorded response cannot be replayed: {0}")]
pub struct Unreplayable(pub String);

impl RecordedResponse {
    /// The allow-listed headers as the ledger stores them (a JSON array of
    /// `[name, value]` pairs); the others are never recorded.
    pub(crate) fn recorded_headers_json(&self) -> String {
        let recorded: Vec<&(String, String)> = self
            .headers
            .iter()
            .filter(|(name, _)| {
                RECORDED_HEADERS
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case(name))
            })
            .collect();
        serde_json::to_string(&recorded).unwrap_or_else(|_| "[]".to_owned())
    }

    /// A response as the ledger wrote it, or why it cannot be replayed.
    pub(crate) fn from_stored(
        status: i32,
        headers: &str,
        body: Vec<u8>,
    ) -> Result<Self, Unreplayable> {
        let status = u16::try_from(status)
            .ok()
            .filter(|s| (100..=599).contains(s))
            .ok_or_else(|| Unreplayable(format!("status {status} is outside 100-599")))?;
        let headers: Vec<(String, String)> = serde_json::from_str(headers)
            .map_err(|e| Unreplayable(format!("headers are not JSON pairs: {e}")))?;
        if let Some((name, _)) = headers
            .iter()
            .find(|(name, value)| !is_token(name) || !is_field_value(value))
        {
            return Err(Unreplayable(format!(
                "header {name:?} is not a valid header line"
            )));
        }
        Ok(Self {
            status,
            headers,
            body,
        })
    }
}

/// An HTTP field name (RFC 9110 §5.6.2 `token`).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// An HTTP field value as this ledger records them: visible ASCII, spaces
/// and tabs inside.
fn is_field_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
        && !value.starts_with([' ', '\t'])
        && !value.ends_with([' ', '\t'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allow_listed_headers_are_recorded() {
        let response = RecordedResponse {
            status: 201,
            headers: vec![
                ("Location".into(), "/x/1".into()),
                ("Set-Cookie".into(), "s=1".into()),
                ("content-type".into(), "application/json".into()),
                ("Authorization".into(), "Bearer t".into()),
            ],
            body: Vec::new(),
        };
        assert_eq!(
            response.recorded_headers_json(),
            r#"[["Location","/x/1"],["content-type","application/json"]]"#
        );
    }

    #[test]
    fn a_stored_response_reads_back_as_it_was_recorded() {
        let stored = RecordedResponse::from_stored(201, r#"[["Location","/x/1"]]"#, b"{}".to_vec());
        assert_eq!(
            stored,
            Ok(RecordedResponse {
                status: 201,
                headers: vec![("Location".into(), "/x/1".into())],
                body: b"{}".to_vec(),
            })
        );
    }

    #[test]
    fn a_stored_status_outside_100_to_599_cannot_be_replayed() {
        for status in [-1, 0, 99, 600, 999, 70_000] {
            assert!(
                RecordedResponse::from_stored(status, "[]", Vec::new()).is_err(),
                "{status}"
            );
        }
        for status in [100, 200, 599] {
            assert!(RecordedResponse::from_stored(status, "[]", Vec::new()).is_ok());
        }
    }

    #[test]
    fn stored_headers_that_do_not_decode_cannot_be_replayed() {
        for headers in [
            "",
            "{}",
            r#"[["Location"]]"#,
            r#"[["Bad Name","v"]]"#,
            r#"[["Location","a\r\nSet-Cookie: x"]]"#,
            r#"[["","v"]]"#,
        ] {
            assert!(
                RecordedResponse::from_stored(200, headers, Vec::new()).is_err(),
                "{headers}"
            );
        }
    }
}
