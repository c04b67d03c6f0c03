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
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    /// What the driver is given: a file path for SQLite, the URL for PostgreSQL.
    target: String,
    /// What the user typed, password hidden: what messages show.
    shown: String,
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
            return Ok(Self {
                backend: Backend::Postgres,
                target: without_gss_unless_asked(raw),
                shown: redact(raw),
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
        if path == ":memory:" {
            return Err(
                "an in-memory SQLite database cannot be shared by a connection pool: name a file"
                    .into(),
            );
        }
        Ok(Self {
            backend: Backend::Sqlite,
            target: path.to_owned(),
            shown: raw.to_owned(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL as the drivers take it.
    pub fn as_str(&self) -> &str {
        &self.target
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
        })
    }
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
            .field("target", &redact(&self.target))
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

/// The URL with its password, if any, replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            match url[scheme_end + 3..at].split_once(':') {
                Some((user, _password)) => {
                    format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
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
