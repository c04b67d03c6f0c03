//! `DATABASE_URL`: which backend it selects, what the driver is given, and
//! how it is shown in messages (as typed, never with its password).

use std::fmt;
use std::path::Path;

use super::Backend;

/// What a refused `DATABASE_URL` is told to look like.
const ACCEPTED: &str =
    "use sqlite://PATH (or a plain file path) or postgres://USER[:PASSWORD]@HOST[:PORT]/DB";

/// A parsed `DATABASE_URL`: `sqlite://path`, `sqlite:path`, a bare file path,
/// or `postgres://…` / `postgresql://…`. A libpq keyword/value string
/// (`host=… dbname=…`) is refused: it is not a file name.
///
/// Its text reaches a message only through [`Display`](fmt::Display) and
/// [`Debug`](fmt::Debug), which show it without its passwords, and
/// [`DatabaseUrl::scrub`], which takes them out of a driver's words.
/// [`DatabaseUrl::as_str`] is for the drivers alone.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    /// What the driver is given: a file path for SQLite, the URL for PostgreSQL.
    target: String,
    /// What the user typed, passwords hidden: what messages show.
    shown: String,
    /// Every password the URL carries, as typed and percent-decoded,
    /// longest first: what [`DatabaseUrl::scrub`] takes out of a message.
    secrets: Vec<String>,
}

impl DatabaseUrl {
    /// Reads a `DATABASE_URL`; an `Err` is one line that says what is accepted.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(format!("DATABASE_URL is empty: {ACCEPTED}"));
        }
        if raw.chars().any(char::is_control) {
            return Err(format!(
                "DATABASE_URL contains a control character: {ACCEPTED}"
            ));
        }
        if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            let (shown, secrets) = redact(raw)?;
            return Ok(Self {
                backend: Backend::Postgres,
                target: without_gss_unless_asked(raw),
                shown,
                secrets,
            });
        }
        if looks_like_keyword_value(raw) {
            return Err(
                "DATABASE_URL looks like a libpq keyword/value string (host=… dbname=…), \
                        which is not supported: write it as a URL, \
                        postgres://USER[:PASSWORD]@HOST[:PORT]/DB"
                    .into(),
            );
        }
        let path = if let Some(rest) = raw.strip_prefix("sqlite://") {
            rest
        } else if let Some(rest) = raw.strip_prefix("sqlite:") {
            rest
        } else if let Some((scheme, _)) = raw.split_once("://") {
            return Err(format!(
                "unsupported DATABASE_URL scheme {scheme:?}: {ACCEPTED}"
            ));
        } else {
            raw
        };
        if path.is_empty() {
            return Err(format!("DATABASE_URL names no SQLite file: {ACCEPTED}"));
        }
        sqlite_target(path)?;
        Ok(Self {
            backend: Backend::Sqlite,
            target: path.to_owned(),
            shown: raw.to_owned(),
            secrets: Vec::new(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL as the drivers take it, password included: never for a
    /// message (messages show [`Display`](fmt::Display), and a driver's
    /// own words go through [`DatabaseUrl::scrub`]).
    pub fn as_str(&self) -> &str {
        &self.target
    }

    /// `text` (a driver's message about this database) with every password
    /// of this URL, as typed or decoded, replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }

    /// PostgreSQL: the database the URL names, percent-decoding aside
    /// (`None` for SQLite, or when the URL names none).
    pub fn database(&self) -> Option<&str> {
        if self.backend != Backend::Postgres {
            return None;
        }
        let (_, name, _) = split_database(&self.target);
        (!name.is_empty()).then_some(name)
    }

    /// The same PostgreSQL server and credentials with another database
    /// (`None` for SQLite).
    pub fn with_database(&self, name: &str) -> Option<Self> {
        if self.backend != Backend::Postgres {
            return None;
        }
        let replace = |url: &str| match split_database(url) {
            (server, _, Some(query)) => format!("{server}/{name}?{query}"),
            (server, _, None) => format!("{server}/{name}"),
        };
        Some(Self {
            backend: Backend::Postgres,
            target: replace(&self.target),
            shown: replace(&self.shown),
            secrets: self.secrets.clone(),
        })
    }
}

/// SQLite URI filename parameters the server keeps its promises with: a
/// mode that keeps the database in a file (`ro` opens it read-only, `rw`
/// refuses to create it, `rwc` is the default), and the default VFS of a
/// Unix system, `unix`, which locks the file with POSIX advisory locks.
const SQLITE_PARAMETERS: &str = "mode=ro, mode=rw, mode=rwc and vfs=unix";

/// Why a SQLite target is refused: what would keep the database in memory
/// (`:memory:`, `mode=memory`, a URI filename that names no file, which
/// SQLite opens as a temporary database), turn off or change its file
/// locking (`nolock`, `immutable`, a `vfs` other than `unix`: `unix-none`
/// locks nothing, `memdb` keeps it in memory), or anything else the server
/// does not know the meaning of: another parameter of a URI filename
/// (`file:PATH?…`, read as SQLite reads it, percent-decoded, up to its
/// `#`), a fragment, and any query of a plain path (`a.db?nolock=1`, which
/// SQLite would take as part of the file name). One line, naming the
/// parameter.
fn sqlite_target(path: &str) -> Result<(), String> {
    const IN_MEMORY: &str = "would keep the database in memory, where nothing outlives the \
                             process and a connection pool does not share it: name a file";
    if path == ":memory:" {
        return Err(format!("DATABASE_URL {path:?} {IN_MEMORY}"));
    }
    let Some(uri) = path.strip_prefix("file:") else {
        let Some((_, query)) = path.split_once('?') else {
            return Ok(());
        };
        let name = query.split(['&', '=']).next().unwrap_or_default();
        return Err(format!(
            "DATABASE_URL's query parameter {name:?} is not one the server understands: a SQLite \
             path takes none (a '?' would become part of the file name); SQLite's own parameters \
             go in a URI filename, sqlite://file:PATH?mode=ro, which takes {SQLITE_PARAMETERS}"
        ));
    };
    if uri.contains('#') {
        return Err(
            "DATABASE_URL's SQLite URI filename has a fragment ('#…'), which SQLite drops: \
             write a '#' of the file name as %23"
                .into(),
        );
    }
    let (file, query) = match uri.split_once('?') {
        Some((file, query)) => (file, Some(query)),
        None => (uri, None),
    };
    // `file://HOST/PATH`: the path starts at the first `/` after the host.
    let file = match file.strip_prefix("//") {
        Some(rest) => rest.find('/').map_or("", |slash| &rest[slash..]),
        None => file,
    };
    let file = percent_encoding::percent_decode_str(file).decode_utf8_lossy();
    if file.is_empty() {
        return Err(
            "DATABASE_URL's SQLite URI filename names no file, which SQLite opens as a \
             temporary database deleted when it closes: name a file"
                .into(),
        );
    }
    if file == ":memory:" {
        return Err(format!("DATABASE_URL {path:?} {IN_MEMORY}"));
    }
    let mut seen: Vec<String> = Vec::new();
    for parameter in query.into_iter().flat_map(|q| q.split('&')) {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
        let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
        if name.is_empty() && value.is_empty() {
            continue;
        }
        if seen.iter().any(|s| *s == name) {
            return Err(format!(
                "DATABASE_URL's SQLite parameter {name:?} is given twice: give it once"
            ));
        }
        match (&*name, &*value) {
            ("mode", "ro" | "rw" | "rwc") | ("vfs", "unix") => {}
            ("mode", "memory") => {
                return Err(format!(
                    "DATABASE_URL's SQLite parameter mode=memory {IN_MEMORY}"
                ));
            }
            ("nolock" | "immutable", _) => {
                return Err(format!(
                    "DATABASE_URL's SQLite parameter {name} turns off SQLite's file locking, \
                     without which another process (a second server, `orders-api migrate`) \
                     writes over this one: a SQLite URI filename takes {SQLITE_PARAMETERS}"
                ));
            }
            ("vfs", _) => {
                return Err(format!(
                    "DATABASE_URL's SQLite parameter vfs={value} changes how the file is \
                     locked or kept (unix-none locks nothing, memdb keeps it in memory): only \
                     vfs=unix, the default, is accepted"
                ));
            }
            ("mode", _) => {
                return Err(format!(
                    "DATABASE_URL's SQLite parameter mode={value} is not a mode the server \
                     understands: a SQLite URI filename takes {SQLITE_PARAMETERS}"
                ));
            }
            _ => {
                return Err(format!(
                    "DATABASE_URL's SQLite parameter {name:?} is not one the server \
                     understands: a SQLite URI filename takes {SQLITE_PARAMETERS}"
                ));
            }
        }
        seen.push(name.into_owned());
    }
    Ok(())
}

/// A PostgreSQL URL cut around its database name: what comes before the
/// `/` that starts the path (scheme, credentials, hosts), the name (empty
/// when there is none), and the query string.
fn split_database(url: &str) -> (&str, &str, Option<&str>) {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let name = base.get(path_start + 1..).unwrap_or("");
    (&base[..path_start], name, query)
}

impl fmt::Display for DatabaseUrl {
    /// As typed, never with a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for DatabaseUrl {
    /// Never prints a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseUrl")
            .field("backend", &self.backend)
            .field("shown", &self.shown)
            .finish()
    }
}

/// `host=db port=5432 dbname=orders`: libpq's other connection-string form.
fn looks_like_keyword_value(raw: &str) -> bool {
    raw.split_whitespace().any(|word| {
        word.split_once('=').is_some_and(|(keyword, _)| {
            !keyword.is_empty()
                && keyword
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
    }) && !Path::new(raw).exists()
}

/// Why SQLite could not open `path`, when the driver only says "Unable to
/// open the database file": a missing folder, or the system's own words for
/// a permission problem, with the path they concern.
pub(crate) fn sqlite_open_cause(path: &str, driver: String) -> String {
    // A URI filename (`file:…?mode=ro`) is SQLite's to interpret.
    if path.starts_with("file:") {
        return driver;
    }
    let file = Path::new(path);
    let folder = match file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match std::fs::metadata(folder) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return format!("the folder {} does not exist", folder.display());
        }
        Err(e) => return format!("{}: {e}", folder.display()),
        Ok(m) if !m.is_dir() => return format!("{} is not a folder", folder.display()),
        Ok(_) => {}
    }
    if file.exists() {
        return match std::fs::File::open(file) {
            Err(e) => format!("{}: {e}", file.display()),
            Ok(_) => driver,
        };
    }
    // The folder exists and the file does not: SQLite could not create it.
    let probe = folder.join(format!(".orders-api-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            driver
        }
        Err(e) => format!("cannot create {} in {}: {e}", path, folder.display()),
    }
}

/// libpq tries GSSAPI (Kerberos) encryption first when it was built with
/// it, which costs a negotiation on every new connection and, worse, can
/// abort the process at exit (libkrb5 destroys its mutexes while a pool
/// thread is still connecting). Unless the URL asks for it, turn it off.
fn without_gss_unless_asked(url: &str) -> String {
    if url.contains("gssencmode=") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&gssencmode=disable")
    } else {
        format!("{url}?gssencmode=disable")
    }
}

/// Why a PostgreSQL URL is refused when it cannot be told where its user
/// name and password end; it never repeats the URL, which holds them.
const AMBIGUOUS_CREDENTIALS: &str = "DATABASE_URL has an '@' where libpq would not end a user \
     name and password with it, so it cannot be told where the password ends: percent-encode \
     '@', '/', '?' and '#' in a user name or password (%40, %2F, %3F, %23)";

/// Why a PostgreSQL URL is refused when a host's port is not a number
/// (libpq would quote it, and it may be a password missing its `@HOST`).
const PORT_NOT_A_NUMBER: &str = "a port in DATABASE_URL is not a number: write \
     postgres://USER[:PASSWORD]@HOST[:PORT]/DB, percent-encoding '@', '/', '?' and '#' in a \
     user name or password (%40, %2F, %3F, %23)";

/// A PostgreSQL URL as messages show it (every password replaced by `***`)
/// and the passwords it carries (as typed and decoded, longest first), read
/// the way libpq reads it: the user name and password end at the first `@`
/// before any `/`, and a query parameter whose name, percent-decoded, ends
/// in `password` (`password`, `sslpassword`; any case) holds one. A URL
/// whose password libpq could read otherwise than its writer meant (an `@`
/// past the host, or an `USER:PASS…@` that a `/` or `?` inside kept libpq
/// from reading as credentials), or that libpq would refuse quoting a part
/// of it (a `%` that starts no escape, a port that is not a number), is
/// refused here, in words that do not repeat it.
fn redact(url: &str) -> Result<(String, Vec<String>), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((url.to_owned(), Vec::new()));
    };
    let mut secrets = Vec::new();
    let (credentials, after) = match rest.find(['@', '/']) {
        Some(at) if rest[at..].starts_with('@') => (Some(&rest[..at]), &rest[at + 1..]),
        _ => (None, rest),
    };
    let (location, query) = match after.split_once('?') {
        Some((location, query)) => (location, Some(query)),
        None => (after, None),
    };
    // Without credentials by libpq's rule, an `@` after text that looks
    // like `USER:PASS` (a `:` and no `=` before it) ends credentials that a
    // `/` or `?` in the password hid from libpq.
    let hidden_credentials = credentials.is_none()
        && rest
            .find('@')
            .is_some_and(|at| rest[..at].contains(':') && !rest[..at].contains('='));
    if location.contains('@') || credentials.is_some_and(|c| c.contains('?')) || hidden_credentials
    {
        return Err(AMBIGUOUS_CREDENTIALS.into());
    }
    if !ports_are_numbers(location) {
        return Err(PORT_NOT_A_NUMBER.into());
    }
    let mut shown = format!("{scheme}://");
    if let Some(credentials) = credentials {
        let (user, password) = match credentials.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (credentials, None),
        };
        let user_ok = percent_decoded(user).is_some();
        let decoded = password.map(percent_decoded);
        if !user_ok || decoded.as_ref().is_some_and(Option::is_none) {
            return Err(
                "the user name or password in DATABASE_URL has a '%' that does not \
                        start an escape of two hex digits (or escapes a NUL byte): write a \
                        '%' as %25"
                    .into(),
            );
        }
        shown.push_str(user);
        if let (Some(password), Some(Some(decoded))) = (password, decoded) {
            shown.push_str(if password.is_empty() { ":" } else { ":***" });
            secrets.extend([password.to_owned(), decoded]);
        }
        shown.push('@');
    }
    shown.push_str(location);
    if let Some(query) = query {
        shown.push('?');
        let mut parameters = Vec::new();
        for parameter in query.split('&').filter(|_| !query.is_empty()) {
            // libpq refuses it quoting it whole: an unencoded `&` in a password.
            let Some((name, value)) = parameter.split_once('=') else {
                return Err(
                    "a parameter in DATABASE_URL's query has no '=': percent-encode \
                            '&' and '=' in a value (%26, %3D)"
                        .into(),
                );
            };
            let (Some(decoded_name), Some(decoded_value)) =
                (percent_decoded(name), percent_decoded(value))
            else {
                return Err(
                    "a parameter in DATABASE_URL's query has a '%' that does not \
                            start an escape of two hex digits (or escapes a NUL byte): write \
                            a '%' as %25"
                        .into(),
                );
            };
            if decoded_name.to_ascii_lowercase().ends_with("password") && !value.is_empty() {
                parameters.push(format!("{name}=***"));
                secrets.extend([value.to_owned(), decoded_value]);
            } else {
                parameters.push(parameter.to_owned());
            }
        }
        shown.push_str(&parameters.join("&"));
    }
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    Ok((shown, secrets))
}

/// Whether every port of the hosts that start `location` (`HOST[:PORT]`,
/// comma-separated, IPv6 addresses in brackets) is empty or a number.
fn ports_are_numbers(location: &str) -> bool {
    let hosts = location.split('/').next().unwrap_or_default();
    hosts.split(',').all(|host| {
        let after_address = match host.rfind(']') {
            Some(end) => &host[end + 1..],
            None => host,
        };
        match after_address.rsplit_once(':') {
            Some((_, port)) => port.bytes().all(|b| b.is_ascii_digit()),
            None => true,
        }
    })
}

/// `text` percent-decoded as libpq decodes a URL's parts (a `+` stays a
/// `+`); `None` where libpq refuses it: a `%` not followed by two hex
/// digits, or `%00`.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(offset) = bytes[i..].iter().position(|&b| b == b'%') {
        let at = i + offset;
        let escape = bytes.get(at + 1..at + 3)?;
        if !escape.iter().all(u8::is_ascii_hexdigit) || escape == b"00" {
            return None;
        }
        i = at + 3;
    }
    Some(
        percent_encoding::percent_decode_str(text)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::one_line;

    #[test]
    fn the_scheme_selects_the_backend() {
        for (raw, backend, target) in [
            ("sqlite://orders.db", Backend::Sqlite, "orders.db"),
            (
                "sqlite:///var/lib/orders.db",
                Backend::Sqlite,
                "/var/lib/orders.db",
            ),
            ("sqlite:orders.db", Backend::Sqlite, "orders.db"),
            ("orders.db", Backend::Sqlite, "orders.db"),
            ("my orders.db", Backend::Sqlite, "my orders.db"),
            (
                "postgres://u@h/db",
                Backend::Postgres,
                "postgres://u@h/db?gssencmode=disable",
            ),
            (
                "postgresql://u@h/db?sslmode=require",
                Backend::Postgres,
                "postgresql://u@h/db?sslmode=require&gssencmode=disable",
            ),
            (
                "postgres://u@h/db?gssencmode=prefer",
                Backend::Postgres,
                "postgres://u@h/db?gssencmode=prefer",
            ),
        ] {
            let url = DatabaseUrl::parse(raw).unwrap();
            assert_eq!((url.backend(), url.as_str()), (backend, target), "{raw}");
        }
    }

    #[test]
    fn unusable_urls_are_refused_with_a_reason_that_names_the_accepted_forms() {
        for raw in [
            "",
            "mysql://h/db",
            "sqlite://",
            "host=127.0.0.1 port=5432 dbname=orders",
            "dbname=orders",
            "orders\n.db",
        ] {
            let err = DatabaseUrl::parse(raw).unwrap_err();
            assert!(err.contains("postgres://"), "{raw:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{raw:?}: {err}");
        }
        assert!(DatabaseUrl::parse("sqlite::memory:").is_err());
    }

    /// A SQLite target the server cannot keep its promises on is refused
    /// in one line that names what is wrong: locking off, in memory, a
    /// parameter it does not know. What it knows still opens.
    #[test]
    fn sqlite_urls_that_turn_off_locking_keep_the_database_in_memory_or_say_what_is_not_understood_are_refused()
     {
        for (raw, named) in [
            ("sqlite://file:/tmp/a.db?vfs=unix-none", "vfs=unix-none"),
            ("file:a.db?vfs=unix-dotfile", "vfs=unix-dotfile"),
            ("sqlite:file:a.db?vfs=memdb", "vfs=memdb"),
            ("sqlite://file:a.db?v%66s=unix-none", "vfs=unix-none"),
            ("sqlite://file:a.db?nolock=1", "nolock"),
            ("sqlite://file:a.db?immutable=1", "immutable"),
            ("sqlite://file::memory:", "in memory"),
            ("sqlite://file:%3Amemory%3A", "in memory"),
            ("sqlite://file::memory:?cache=shared", "in memory"),
            ("sqlite://file:a.db?mode=memory", "in memory"),
            ("sqlite://file:a.db?mode=ro&mode=memory", "twice"),
            ("sqlite://:memory:", "in memory"),
            ("sqlite::memory:", "in memory"),
            (":memory:", "in memory"),
            ("sqlite://file:", "names no file"),
            ("sqlite://file:?mode=rwc", "names no file"),
            ("sqlite://file://localhost?mode=rwc", "names no file"),
            ("sqlite://file:a.db?cache=shared", "\"cache\""),
            ("sqlite://file:a.db?Mode=ro", "\"Mode\""),
            ("sqlite://file:a.db?mode=rwx", "mode=rwx"),
            ("sqlite://file:a.db#x", "fragment"),
            ("sqlite://a.db?nolock=1", "\"nolock\""),
            ("a.db?mode=memory", "\"mode\""),
            ("sqlite:a.db?", "\"\""),
        ] {
            let err = DatabaseUrl::parse(raw).unwrap_err();
            assert!(err.contains(named), "{raw}: {err}");
            assert_eq!(err.lines().count(), 1, "{raw}: {err}");
        }
        for (raw, target) in [
            ("sqlite://file:a.db?mode=ro", "file:a.db?mode=ro"),
            (
                "sqlite://file:///tmp/a.db?mode=rwc&vfs=unix",
                "file:///tmp/a.db?mode=rwc&vfs=unix",
            ),
            ("sqlite://file:a%23b.db", "file:a%23b.db"),
            ("sqlite://file:a.db?", "file:a.db?"),
            ("sqlite:///tmp/a#b.db", "/tmp/a#b.db"),
            ("memory.db", "memory.db"),
        ] {
            let url = DatabaseUrl::parse(raw).unwrap();
            assert_eq!(url.as_str(), target, "{raw}");
        }
    }

    #[test]
    fn messages_show_the_url_as_typed_without_its_password() {
        let url = DatabaseUrl::parse("postgres://orders:s3cret@db/orders").unwrap();
        assert_eq!(url.to_string(), "postgres://orders:***@db/orders");
        let shown = format!("{url:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("orders:***@db"),
            "{shown}"
        );
        assert_eq!(
            DatabaseUrl::parse(" orders.db").unwrap().to_string(),
            "orders.db"
        );
    }

    /// Every place libpq reads a password from in a URL: the user
    /// information, and a `password` (or `sslpassword`) query parameter in
    /// any position, its name or value percent-encoded in either case.
    #[test]
    fn every_password_libpq_reads_from_a_url_is_hidden_in_what_messages_show() {
        for (raw, shown) in [
            ("postgres://u:S3cret@h/db", "postgres://u:***@h/db"),
            ("postgres://u:@h/db", "postgres://u:@h/db"),
            (
                "postgres://u@h/db?password=S3cret",
                "postgres://u@h/db?password=***",
            ),
            (
                "postgresql://u@h:1,h2:2/db?sslmode=disable&password=S3cret&application_name=a",
                "postgresql://u@h:1,h2:2/db?sslmode=disable&password=***&application_name=a",
            ),
            (
                "postgres://u@h/db?p%61ssword=S3cret",
                "postgres://u@h/db?p%61ssword=***",
            ),
            (
                "postgres://u@h/db?PASSWORD=S3cret",
                "postgres://u@h/db?PASSWORD=***",
            ),
            (
                "postgres://u@h/db?sslpassword=S3cret",
                "postgres://u@h/db?sslpassword=***",
            ),
            (
                "postgres://u@h?password=S3cret",
                "postgres://u@h?password=***",
            ),
            (
                "postgres://u:S3%2fcret@h/db?password=S3%2Fcret",
                "postgres://u:***@h/db?password=***",
            ),
        ] {
            let url = DatabaseUrl::parse(raw).unwrap();
            assert_eq!(url.to_string(), shown, "{raw}");
            let debug = format!("{url:?}");
            assert!(!debug.contains("S3"), "{raw}: {debug}");
            assert!(
                url.as_str().starts_with(raw),
                "the driver gets it whole: {raw}"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Whatever else the URL holds, and wherever the password sits (the
        /// user information or a `password` parameter among others), a URL
        /// that parses shows no password.
        #[test]
        fn no_url_that_parses_shows_its_password(
            user in "[a-z%0-9]{0,6}",
            hosts in "[a-z0-9.,:\\[\\]]{0,12}",
            path in "(/[a-z@%0-9]{0,6})?",
            before in proptest::collection::vec("[a-z_%0-9]{1,6}=[a-z%0-9=]{0,6}", 0..3),
            after in proptest::collection::vec("[a-z_%0-9]{1,6}=[a-z%0-9=]{0,6}", 0..3),
            in_query in proptest::bool::ANY,
            name in "(password|p%61ssword|P%41SSWORD|sslpassword)",
            password in "PW[A-Z%2F@/?&#0-9]{6,12}",
        ) {
            let raw = if in_query {
                let params = [before, vec![format!("{name}={password}")], after].concat();
                format!("postgres://{user}@{hosts}{path}?{}", params.join("&"))
            } else {
                let query = [before, after].concat().join("&");
                format!("postgres://{user}:{password}@{hosts}{path}?{query}")
            };
            if let Ok(url) = DatabaseUrl::parse(&raw) {
                let (shown, debug) = (url.to_string(), format!("{url:?}"));
                proptest::prop_assert!(!shown.contains("PW") && !debug.contains("PW"), "{} shows {}", raw, shown);
                proptest::prop_assert!(!url.scrub(&raw).contains("PW"), "{}", raw);
            }
        }
    }

    #[test]
    fn a_drivers_message_is_scrubbed_of_the_password_as_typed_and_as_decoded() {
        let url = DatabaseUrl::parse("postgres://u:S3%2Fcret@h/db?sslpassword=k%65y1").unwrap();
        let driver = "unexpected character in URI: \"postgres://u:S3%2Fcret@h/db\", \
                      tried S3/cret, then key1 and k%65y1";
        assert_eq!(
            url.scrub(driver),
            "unexpected character in URI: \"postgres://u:***@h/db\", tried ***, then *** and ***"
        );
        let sqlite = DatabaseUrl::parse("orders.db").unwrap();
        assert_eq!(sqlite.scrub("no such table"), "no such table");
    }

    /// A URL libpq could read otherwise than the service (an `@` past the
    /// host, a `?` before it) or would refuse quoting it whole (a `%` that
    /// starts no escape) is refused, in words that never repeat it.
    #[test]
    fn a_url_whose_password_cannot_be_told_apart_is_refused_without_repeating_it() {
        for raw in [
            "postgres://u:S3c@ret@h/db",
            "postgres://u:S3c/ret@h/db",
            "postgres://u:S3c?ret@h/db",
            "postgres://u:S3c%zzret@h/db",
            "postgres://u:S3c%00ret@h/db",
            "postgres://u@h/db?password=S3c%2",
            "postgres://u@h/db?p%7password=S3cret",
            "postgres://u:S3c/r?et@h/db",
            "postgres://u:S3c?r/et@h/db",
            "postgres://:S3c/0%?A?@?",
            "postgres://u:S3cret/db",
            "postgres://h1:1,u:S3cret/db",
            "postgres://u@h/db?password=S3&cret",
        ] {
            let err = DatabaseUrl::parse(raw).unwrap_err();
            assert!(!err.contains("S3c"), "{raw}: {err}");
            assert!(err.contains('%'), "it says how to write it: {err}");
            assert_eq!(err.lines().count(), 1);
        }
    }

    #[test]
    fn another_database_on_the_same_server_keeps_hosts_and_parameters() {
        let url = DatabaseUrl::parse(
            "postgres://u:p@h1:5432,h2:5433/orders?target_session_attrs=read-write",
        )
        .unwrap();
        let admin = url.with_database("postgres").unwrap();
        assert_eq!(
            admin.as_str(),
            "postgres://u:p@h1:5432,h2:5433/postgres?target_session_attrs=read-write&gssencmode=disable"
        );
        assert_eq!(
            admin.to_string(),
            "postgres://u:***@h1:5432,h2:5433/postgres?target_session_attrs=read-write"
        );
        let bare = DatabaseUrl::parse("postgres://u@h").unwrap();
        assert_eq!(
            bare.with_database("x").unwrap().to_string(),
            "postgres://u@h/x"
        );
        assert!(
            DatabaseUrl::parse("x.db")
                .unwrap()
                .with_database("y")
                .is_none()
        );
    }

    #[test]
    fn libpq_messages_are_folded_into_one_readable_line() {
        let refused = "connection to server at \"127.0.0.1\", port 1 failed: Connection refused\n\
                       \tIs the server running on that host and accepting TCP/IP connections?\n\
                       connection to server at \"127.0.0.1\", port 2 failed: Connection refused\n\
                       \tIs the server running on that host and accepting TCP/IP connections?\n";
        assert_eq!(
            one_line(refused),
            "connection to server at \"127.0.0.1\", port 1 failed: Connection refused. \
             Is the server running on that host and accepting TCP/IP connections? \
             connection to server at \"127.0.0.1\", port 2 failed: Connection refused. \
             Is the server running on that host and accepting TCP/IP connections?"
        );
        let closed = "server closed the connection unexpectedly\n\
                      \tThis probably means the server terminated abnormally\n\
                      \tbefore or while processing the request.\n";
        assert_eq!(
            one_line(closed),
            "server closed the connection unexpectedly. This probably means the server \
             terminated abnormally before or while processing the request."
        );
    }
}
