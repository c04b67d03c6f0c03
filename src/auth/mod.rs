//! API keys: bearer tokens that name a user. Only a SHA-256 hash of each
//! token is stored; the token itself is shown once, when it is created.

pub mod cache;
#[cfg(feature = "test-hooks")]
pub mod hooks;

use chrono::{DateTime, SubsecRound, Utc};
use diesel::prelude::*;
use sha2::{Digest, Sha256};

use crate::db::{Conn, dispatch};

const TOKEN_PREFIX: &str = "oa_";
const TOKEN_RANDOM_BYTES: usize = 32;
/// How much of a token `keys list` shows: the prefix and eight hex digits.
const SHOWN_PREFIX_LEN: usize = TOKEN_PREFIX.len() + 8;
pub const MAX_USER_ID_LEN: usize = 100;

/// A key as `keys list` shows it: never the token.
#[derive(Debug, Clone, Queryable)]
pub struct ApiKeyInfo {
    pub id: i64,
    pub user_id: String,
    pub token_prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyAdminError {
    #[error("USER_ID {0}")]
    BadUserId(&'static str),
    #[error(
        "TOKEN_OR_ID must be a key's id, its prefix as `keys list` shows it ({TOKEN_PREFIX} and 8 \
         hex digits) or its whole token"
    )]
    BadKeyReference,
    #[error("the system's random number generator failed: {0}")]
    Random(String),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// `oa_` followed by 64 hex digits (256 random bits).
pub fn generate_token() -> Result<String, KeyAdminError> {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| KeyAdminError::Random(e.to_string()))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

/// Whether a string has the shape of a token this service issues; anything
/// else is refused without a database lookup.
pub fn looks_like_token(s: &str) -> bool {
    s.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
        hex.len() == TOKEN_RANDOM_BYTES * 2 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Checks a user id: 1 to [`MAX_USER_ID_LEN`] printable ASCII characters,
/// not beginning or ending with whitespace (`" bob"` would be another user
/// than `"bob"`, and look the same in every listing).
pub fn check_user_id(user_id: &str) -> Result<(), KeyAdminError> {
    let message = if user_id.trim().is_empty() {
        "must not be empty or only whitespace"
    } else if user_id.trim() != user_id {
        "must not begin or end with whitespace"
    } else if user_id.len() > MAX_USER_ID_LEN {
        "must be at most 100 characters"
    } else if !user_id.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        "must be printable ASCII (letters, digits, punctuation and inner spaces)"
    } else {
        return Ok(());
    };
    Err(KeyAdminError::BadUserId(message))
}

/// Which key `keys revoke` means: its id, the prefix `keys list` shows, or
/// its whole token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRef {
    Id(i64),
    Prefix(String),
    Token(String),
}

impl KeyRef {
    pub fn parse(raw: &str) -> Result<Self, KeyAdminError> {
        let raw = raw.trim();
        if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
            return raw
                .parse()
                .map(KeyRef::Id)
                .map_err(|_| KeyAdminError::BadKeyReference);
        }
        if looks_like_token(raw) {
            return Ok(KeyRef::Token(raw.to_owned()));
        }
        // As `keys list` shows it, with or without its ellipsis.
        let prefix = raw
            .strip_suffix('…')
            .or_else(|| raw.strip_suffix("..."))
            .unwrap_or(raw);
        let shaped = prefix.len() == SHOWN_PREFIX_LEN
            && prefix.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
                hex.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            });
        if shaped {
            Ok(KeyRef::Prefix(prefix.to_owned()))
        } else {
            Err(KeyAdminError::BadKeyReference)
        }
    }
}

impl std::fmt::Display for KeyRef {
    /// Never the whole token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyRef::Id(id) => write!(f, "id {id}"),
            KeyRef::Prefix(prefix) => write!(f, "{prefix}…"),
            KeyRef::Token(token) => write!(f, "{}…", &token[..SHOWN_PREFIX_LEN]),
        }
    }
}

/// What `revoke` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    Revoked {
        id: i64,
        user_id: String,
    },
    AlreadyRevoked {
        id: i64,
        at: DateTime<Utc>,
    },
    NoMatch,
    /// Several active keys share the prefix: revoke by id.
    Ambiguous(usize),
}

/// Creates a key for `user_id` and returns its token.
pub fn create(conn: &mut Conn<'_>, user_id: &str) -> Result<String, KeyAdminError> {
    check_user_id(user_id)?;
    let token = generate_token()?;
    let hash = hash_token(&token);
    let prefix = &token[..SHOWN_PREFIX_LEN];
    let now = Utc::now().trunc_subsecs(6);
    dispatch!(conn, c, s => {
        use s::api_keys::dsl as k;
        diesel::insert_into(k::api_keys)
            .values((
                k::user_id.eq(user_id),
                k::token_hash.eq(&hash),
                k::token_prefix.eq(prefix),
                k::created_at.eq(now),
            ))
            .execute(c)
    })?;
    Ok(token)
}

pub fn list(conn: &mut Conn<'_>) -> QueryResult<Vec<ApiKeyInfo>> {
    dispatch!(conn, c, s => {
        use s::api_keys::dsl as k;
        k::api_keys
            .select((k::id, k::user_id, k::token_prefix, k::created_at, k::revoked_at))
            .order(k::id)
            .load::<ApiKeyInfo>(c)
    })
}

pub fn any_exist(conn: &mut Conn<'_>) -> QueryResult<bool> {
    dispatch!(conn, c, s => {
        diesel::select(diesel::dsl::exists(s::api_keys::table.select(s::api_keys::id))).get_result(c)
    })
}

/// Revokes the key `key` names, if exactly one active key matches.
pub fn revoke(conn: &mut Conn<'_>, key: &KeyRef) -> QueryResult<Revocation> {
    type Match = (i64, String, Option<DateTime<Utc>>);
    let matches: Vec<Match> = dispatch!(conn, c, s => {
        use s::api_keys::dsl as k;
        let columns = (k::id, k::user_id, k::revoked_at);
        match key {
            KeyRef::Id(id) => k::api_keys.filter(k::id.eq(*id)).select(columns).load(c),
            KeyRef::Prefix(prefix) => k::api_keys.filter(k::token_prefix.eq(prefix)).select(columns).load(c),
            KeyRef::Token(token) => k::api_keys.filter(k::token_hash.eq(hash_token(token))).select(columns).load(c),
        }
    })?;
    let active: Vec<&Match> = matches.iter().filter(|m| m.2.is_none()).collect();
    let (id, user_id) = match (active.as_slice(), matches.first()) {
        ([(id, user_id, _)], _) => (*id, user_id.clone()),
        ([], Some((id, _, Some(at)))) => {
            return Ok(Revocation::AlreadyRevoked { id: *id, at: *at });
        }
        ([], _) => return Ok(Revocation::NoMatch),
        (several, _) => return Ok(Revocation::Ambiguous(several.len())),
    };
    let now = Utc::now().trunc_subsecs(6);
    let n = dispatch!(conn, c, s => {
        use s::api_keys::dsl as k;
        diesel::update(k::api_keys.filter(k::id.eq(id).and(k::revoked_at.is_null())))
            .set(k::revoked_at.eq(Some(now)))
            .execute(c)
    })?;
    // Revoked by someone else meanwhile.
    Ok(if n == 0 {
        Revocation::AlreadyRevoked { id, at: now }
    } else {
        Revocation::Revoked { id, user_id }
    })
}

/// The user a live token belongs to.
pub fn authenticate(conn: &mut Conn<'_>, token: &str) -> QueryResult<Option<String>> {
    user_of_hash(conn, &hash_token(token))
}

/// The user of a live token, given its [`hash_token`] (for a caller that
/// hashed it already).
pub fn user_of_hash(conn: &mut Conn<'_>, hash: &str) -> QueryResult<Option<String>> {
    dispatch!(conn, c, s => {
        use s::api_keys::dsl as k;
        k::api_keys
            .filter(k::token_hash.eq(hash).and(k::revoked_at.is_null()))
            .select(k::user_id)
            .get_result::<String>(c)
            .optional()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_have_the_issued_shape_and_differ() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert!(looks_like_token(&a) && looks_like_token(&b));
        assert_ne!(a, b);
        assert!(!looks_like_token("oa_123"));
        assert!(!looks_like_token(&a.replace("oa_", "xx_")));
    }

    #[test]
    fn user_ids_with_outer_whitespace_are_refused_with_a_message_that_says_so() {
        assert!(check_user_id("bob").is_ok());
        assert!(check_user_id("bob smith").is_ok());
        for (raw, says) in [
            (" bob", "whitespace"),
            ("bob\t", "whitespace"),
            ("  ", "empty or only whitespace"),
            ("", "empty"),
            ("bøb", "printable ASCII"),
            ("b\u{7}b", "printable ASCII"),
        ] {
            let message = check_user_id(raw).unwrap_err().to_string();
            assert!(message.contains(says), "{raw:?}: {message}");
        }
        assert!(check_user_id(&"a".repeat(MAX_USER_ID_LEN)).is_ok());
        assert!(check_user_id(&"a".repeat(MAX_USER_ID_LEN + 1)).is_err());
    }

    #[test]
    fn a_key_is_named_by_its_id_its_listed_prefix_or_its_token() {
        let token = generate_token().unwrap();
        let prefix = &token[..SHOWN_PREFIX_LEN];
        assert_eq!(KeyRef::parse("7").unwrap(), KeyRef::Id(7));
        assert_eq!(KeyRef::parse(&token).unwrap(), KeyRef::Token(token.clone()));
        for shown in [
            prefix.to_owned(),
            format!("{prefix}…"),
            format!("{prefix}..."),
        ] {
            assert_eq!(
                KeyRef::parse(&shown).unwrap(),
                KeyRef::Prefix(prefix.to_owned())
            );
        }
        for bad in [
            "",
            "oa_",
            "oa_12",
            "bob",
            "-1",
            "99999999999999999999",
            "oa_ééééé",
        ] {
            assert!(KeyRef::parse(bad).is_err(), "{bad}");
        }
        assert!(
            !KeyRef::Token(token.clone())
                .to_string()
                .contains(&token[SHOWN_PREFIX_LEN..])
        );
    }

    #[test]
    fn the_stored_hash_does_not_contain_the_token() {
        let t = generate_token().unwrap();
        let h = hash_token(&t);
        assert_eq!(h.len(), 64);
        assert!(!h.contains(&t[3..]));
    }
}
