//! API keys: bearer tokens that name a user. Only a SHA-256 hash of each
//! token is stored; the token itself is shown once, when it is created.

pub mod cache;

use chrono::{DateTime, SubsecRound, Utc};
use diesel::prelude::*;
use sha2::{Digest, Sha256};

use crate::db::{Conn, dispatch};

const TOKEN_PREFIX: &str = "oa_";
const TOKEN_RANDOM_BYTES: usize = 32;
/// How much of a token `keys list` shows: the prefix and four hex digits.
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
    #[error("USER_ID must be 1 to {MAX_USER_ID_LEN} printable ASCII characters")]
    BadUserId,
    #[error("the system's random number generator failed: {0}")]
    Random(String),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// `oa_` followed by 64 hex digits (256 random bits).
pub fn generate_token() -> Result<String, KeyAdminError> {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| KeyAdminError::Random(e.to_string()))?;
    Ok(bytes.iter().fold(String::from(TOKEN_PREFIX), |mut s, b| {
        s.push_str(&format!("{b:02x}"));
        s
    }))
}

/// Whether a string has the shape of a token this service issues; anything
/// else is refused without a database lookup.
pub fn looks_like_token(s: &str) -> bool {
    s.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
        hex.len() == TOKEN_RANDOM_BYTES * 2 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

pub fn hash_token(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

fn valid_user_id(user_id: &str) -> bool {
    !user_id.trim().is_empty()
        && user_id.len() <= MAX_USER_ID_LEN
        && user_id.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// Creates a key for `user_id` and returns its token.
pub fn create(conn: &mut Conn<'_>, user_id: &str) -> Result<String, KeyAdminError> {
    if !valid_user_id(user_id) {
        return Err(KeyAdminError::BadUserId);
    }
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

/// Revokes the key given by its whole token or its numeric id; `false` when
/// no active key matched.
pub fn revoke(conn: &mut Conn<'_>, token_or_id: &str) -> QueryResult<bool> {
    let now = Utc::now().trunc_subsecs(6);
    let by_id = token_or_id.trim().parse::<i64>().ok();
    let hash = hash_token(token_or_id.trim());
    let n = dispatch!(conn, c, s => {
        use s::api_keys::dsl as k;
        let target = k::api_keys.filter(k::revoked_at.is_null());
        match by_id {
            Some(id) => diesel::update(target.filter(k::id.eq(id))).set(k::revoked_at.eq(Some(now))).execute(c),
            None => diesel::update(target.filter(k::token_hash.eq(&hash))).set(k::revoked_at.eq(Some(now))).execute(c),
        }
    })?;
    Ok(n > 0)
}

/// The user a live token belongs to.
pub fn authenticate(conn: &mut Conn<'_>, token: &str) -> QueryResult<Option<String>> {
    let hash = hash_token(token);
    dispatch!(conn, c, s => {
        use s::api_keys::dsl as k;
        k::api_keys
            .filter(k::token_hash.eq(&hash).and(k::revoked_at.is_null()))
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
    fn the_stored_hash_does_not_contain_the_token() {
        let t = generate_token().unwrap();
        let h = hash_token(&t);
        assert_eq!(h.len(), 64);
        assert!(!h.contains(&t[3..]));
    }
}
