//! The server's settings. Every setting is a flag and an environment
//! variable; a flag wins. The commands that take them are in [`crate::cli`].

use std::time::Duration;

use clap::Args;

use idempotency_ledger::DEFAULT_WRITE_ADMISSION;
use idempotency_ledger::{DEFAULT_WAITERS_PER_KEY, Ledger};

use crate::db::{DatabaseUrl, Pool, PoolOptions};

/// `DATABASE_URL`'s default: a file in the current folder.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://orders.db";
pub(crate) const DEFAULT_LEASE_SECS: u64 = 30;
pub(crate) const DEFAULT_DB_TIMEOUT_SECS: u64 = 3;
/// `IDEMPOTENCY_WAIT_SECS`'s default.
pub const DEFAULT_WAIT_SECS: u64 = 5;

/// The server's settings (`serve`, and the bare `orders-api`).
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// sqlite://PATH (the default, embedded) or postgres://USER@HOST:PORT/DB;
    /// created when it does not exist. A SQLite URI filename
    /// (sqlite://file:PATH?…) takes mode=ro|rw|rwc and vfs=unix only; a query
    /// on a plain path, locking off and in-memory databases are refused.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL,
          value_parser = DatabaseUrlParser, hide_env_values = true)]
    pub database_url: DatabaseUrl,

    /// Address to listen on (port 0 picks a free port).
    #[arg(long = "bind", env = "BIND_ADDR", default_value = "127.0.0.1:8080")]
    pub bind: String,

    /// How long a recorded response is replayed, in seconds.
    #[arg(long = "retention-secs", env = "IDEMPOTENCY_RETENTION_SECS", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_secs: u64,

    /// How long a request's unit of writing may hold its key, in seconds:
    /// past it, it is rolled back, records nothing and is answered 503.
    #[arg(long = "lease-secs", env = "IDEMPOTENCY_LEASE_SECS", default_value_t = DEFAULT_LEASE_SECS,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub lease_secs: u64,

    /// How long a request waits for another one with its Idempotency-Key to
    /// finish before it is answered 409 IDEMPOTENCY_IN_PROGRESS, in seconds.
    #[arg(long = "idempotency-wait-secs", env = "IDEMPOTENCY_WAIT_SECS", default_value_t = DEFAULT_WAIT_SECS,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    pub idempotency_wait_secs: u64,

    /// How often expired ledger entries are purged, in seconds.
    #[arg(long = "purge-interval-secs", env = "PURGE_INTERVAL_SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub purge_interval_secs: u64,

    /// The largest request body accepted, in bytes.
    #[arg(long = "max-body-bytes", env = "MAX_BODY_BYTES", default_value_t = 65_536,
          value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub max_body_bytes: u64,

    /// Comma-separated origins allowed cross-origin access, each
    /// http(s)://HOST or http(s)://HOST:PORT (a port in 1-65535; no user,
    /// path, query or fragment), or `*` for any; empty: none.
    #[arg(long = "cors-allowed-origins", env = "CORS_ALLOWED_ORIGINS", default_value = "",
          value_delimiter = ',', value_parser = parse_origin)]
    pub cors_allowed_origins: Vec<String>,

    /// Connections in the database pool of this process.
    #[arg(long = "pool-size", env = "DATABASE_POOL_SIZE", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_size: u32,

    /// How long a request waits for a database connection before a 503, in seconds.
    #[arg(long = "db-timeout-secs", env = "DATABASE_TIMEOUT_SECS", default_value_t = DEFAULT_DB_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..=60))]
    pub db_timeout_secs: u64,

    /// How long a process keeps what the database said about a token
    /// (accepted, or unknown), in seconds: a revoked key stops working
    /// within this time after the revocation (0: look every token up on
    /// every request).
    #[arg(long = "auth-cache-secs", env = "AUTH_CACHE_SECS", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(0..=60))]
    pub auth_cache_secs: u64,

    /// How long a process answers the retries of a recorded key from what a
    /// read of it found, in seconds, without reading it again: an entry
    /// changed behind the service's back (deleted by hand, a backup
    /// restored) is seen within this time; never past the entry's expiry
    /// (0: every retry reads the database).
    #[arg(long = "replay-cache-secs", env = "REPLAY_CACHE_SECS", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(0..=60))]
    pub replay_cache_secs: u64,

    /// SQLite: how many writes may wait for the group-commit writer before
    /// further ones are answered 503 with Retry-After.
    #[arg(long = "write-queue", env = "SQLITE_WRITE_QUEUE", default_value_t = 4_096,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub write_queue: u32,

    /// How many writes this process runs or queues at once (a replay, a
    /// refusal and a duplicate waiting for its key take none); past it a
    /// write is answered 503 with Retry-After at once, its key untouched.
    #[arg(long = "write-admission", env = "WRITE_ADMISSION", default_value_t = DEFAULT_WRITE_ADMISSION,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub write_admission: u32,

    /// HTTP worker threads (default: one per CPU core).
    #[arg(long = "workers", env = "HTTP_WORKERS", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: Option<u16>,
}

/// Reads `--database-url` / `DATABASE_URL` with [`DatabaseUrl::parse`].
/// A refusal says why without repeating the value, which may hold a
/// password (clap's own "invalid value '…'" would print it); `--help`
/// never shows the environment's value either (`hide_env_values`).
#[derive(Debug, Clone, Copy)]
pub struct DatabaseUrlParser;

impl clap::builder::TypedValueParser for DatabaseUrlParser {
    type Value = DatabaseUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<DatabaseUrl, clap::Error> {
        let refuse = |why: &str| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '--database-url' (DATABASE_URL): {why}\n"),
            )
            .with_cmd(cmd)
        };
        let raw = value
            .to_str()
            .ok_or_else(|| refuse("it is not valid UTF-8"))?;
        DatabaseUrl::parse(raw).map_err(|why| refuse(&why))
    }
}

/// An origin as browsers send it: `http(s)://host[:port]` with a port in
/// 1–65535, or `*`. Nothing else: no user information, path (not even `/`),
/// query or fragment. It is read by the `url` crate (WHATWG URL) and kept
/// as a browser serializes it in its `Origin` header (the host lowercased
/// and, for a name outside ASCII, in punycode; the scheme's default port
/// left out), which is what the CORS layer compares byte for byte.
pub(crate) fn parse_origin(raw: &str) -> Result<String, String> {
    let origin = raw.trim();
    if origin.is_empty() || origin == "*" {
        return Ok(origin.to_owned());
    }
    let refuse = |why: &str| {
        format!(
            "{origin:?} is not an origin ({why}): expected http(s)://host[:port], a port in \
             1-65535, with no user, path, query or fragment"
        )
    };
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Err(refuse("no scheme"));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(refuse("the scheme is not http or https"));
    }
    if rest.contains(['/', '\\', '?', '#']) {
        return Err(refuse("it has a path, a query or a fragment"));
    }
    if rest.contains('@') {
        return Err(refuse("it has a user"));
    }
    if rest.ends_with(':') {
        return Err(refuse("an empty port"));
    }
    let url = url::Url::parse(origin).map_err(|e| refuse(&e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("it has a user"));
    }
    if url.port() == Some(0) {
        return Err(refuse("port 0"));
    }
    match url.origin() {
        url::Origin::Tuple(..) if url.host().is_some() => Ok(url.origin().ascii_serialization()),
        _ => Err(refuse("no host")),
    }
}

/// The longest retention accepted: 100 years. An entry's expiry must stay a
/// four-digit year: SQLite compares timestamps as text, so an expiry in the
/// year 10000 (a retention of about 2.5e11 s) would sort before today's and
/// be purged at once.
pub const MAX_RETENTION_SECS: u64 = 100 * 365 * 86_400;
/// The longest purge interval accepted: 30 days. A timer much further away
/// is beyond what the runtime's clock can add.
pub const MAX_PURGE_INTERVAL_SECS: u64 = 30 * 86_400;

impl Settings {
    /// Refuses, with one line that names the setting, values that parse but
    /// cannot work. Run before anything else at startup.
    pub fn validate(&self) -> Result<(), String> {
        let checks = [
            (
                "IDEMPOTENCY_RETENTION_SECS (--retention-secs)",
                self.retention_secs,
                MAX_RETENTION_SECS,
                "100 years",
            ),
            (
                "PURGE_INTERVAL_SECS (--purge-interval-secs)",
                self.purge_interval_secs,
                MAX_PURGE_INTERVAL_SECS,
                "30 days",
            ),
        ];
        for (name, value, max, spelled) in checks {
            if value > max {
                return Err(format!(
                    "{name} is {value}; it must be at most {max} ({spelled})"
                ));
            }
        }
        Ok(())
    }

    /// Settings with every default, for `url`; what tests start from.
    pub fn for_database(url: DatabaseUrl) -> Self {
        Self {
            database_url: url,
            bind: "127.0.0.1:0".into(),
            retention_secs: 86_400,
            lease_secs: DEFAULT_LEASE_SECS,
            idempotency_wait_secs: DEFAULT_WAIT_SECS,
            purge_interval_secs: 300,
            max_body_bytes: 65_536,
            cors_allowed_origins: Vec::new(),
            pool_size: 10,
            db_timeout_secs: DEFAULT_DB_TIMEOUT_SECS,
            auth_cache_secs: 1,
            replay_cache_secs: 1,
            write_queue: 4_096,
            write_admission: DEFAULT_WRITE_ADMISSION,
            workers: None,
        }
    }

    pub fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            max_size: self.pool_size,
            connection_timeout: Duration::from_secs(self.db_timeout_secs),
            lease: Duration::from_secs(self.lease_secs),
            write_queue: usize::try_from(self.write_queue).unwrap_or(usize::MAX),
            shown: self.database_url.to_string(),
        }
    }

    /// The idempotency ledger of this process, writing through `pool`
    /// (whose options carry the lease: [`Settings::pool_options`]).
    pub fn ledger(&self, pool: Pool) -> Ledger {
        Ledger::new(pool, self.ledger_settings())
    }

    /// The ledger's own settings.
    pub fn ledger_settings(&self) -> idempotency_ledger::Settings {
        idempotency_ledger::Settings {
            retention: Duration::from_secs(self.retention_secs),
            wait: Duration::from_secs(self.idempotency_wait_secs),
            waiters_per_key: DEFAULT_WAITERS_PER_KEY,
            write_admission: self.write_admission,
            remember: Duration::from_secs(self.replay_cache_secs),
        }
    }

    pub fn cors_origins(&self) -> Vec<String> {
        self.cors_allowed_origins
            .iter()
            .filter(|o| !o.is_empty())
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::cli::{Cli, Command, KeysCommand};

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("orders-api").chain(args.iter().copied()))
            .map(Cli::into_command)
    }

    #[test]
    fn the_defaults_are_those_of_the_contract() {
        let Ok(Command::Serve(s)) = parse(&[]) else {
            panic!("the bare command serves")
        };
        assert_eq!(s.bind, "127.0.0.1:8080");
        assert_eq!(
            (
                s.retention_secs,
                s.lease_secs,
                s.purge_interval_secs,
                s.max_body_bytes
            ),
            (86_400, 30, 300, 65_536)
        );
        assert!(s.cors_origins().is_empty());
        assert_eq!(s.database_url.as_str(), "orders.db");
    }

    #[test]
    fn the_bare_command_takes_every_server_flag() {
        let Ok(Command::Serve(s)) = parse(&["--bind", "127.0.0.1:9", "--workers", "3"]) else {
            panic!("the bare command serves")
        };
        assert_eq!((s.bind.as_str(), s.workers), ("127.0.0.1:9", Some(3)));
    }

    #[test]
    fn the_database_flag_is_accepted_before_and_after_a_keys_subcommand() {
        for args in [
            ["keys", "create", "alice", "--database-url", "sqlite://x.db"],
            ["keys", "--database-url", "sqlite://x.db", "create", "alice"],
        ] {
            let Ok(Command::Keys(keys)) = parse(&args) else {
                panic!("{args:?} is a keys command")
            };
            assert_eq!(keys.database.database_url.as_str(), "x.db", "{args:?}");
            assert!(
                matches!(keys.command, KeysCommand::Create { ref user_id } if user_id == "alice")
            );
        }
    }

    #[test]
    fn a_command_that_does_not_serve_refuses_the_servers_flags() {
        assert!(parse(&["migrate", "--bind", "127.0.0.1:9"]).is_err());
        assert!(parse(&["keys", "list", "--workers", "2"]).is_err());
        assert!(parse(&["purge", "--lease-secs", "5"]).is_err());
        for command in [
            &["keys", "list"][..],
            &["migrate"],
            &["purge"],
            &["client", "sync"],
            &["atk"],
        ] {
            assert!(parse(command).is_ok(), "{command:?}");
            for flag in ["--auth-cache-secs", "--write-queue"] {
                let args = [command, &[flag, "5"]].concat();
                assert!(parse(&args).is_err(), "{args:?} is accepted");
            }
        }
        for command in [&[][..], &["serve"]] {
            let args = [command, &["--auth-cache-secs", "5", "--write-queue", "9"]].concat();
            let Ok(Command::Serve(s)) = parse(&args) else {
                panic!("{args:?} serves")
            };
            assert_eq!((s.auth_cache_secs, s.write_queue), (5, 9));
        }
    }

    #[test]
    fn the_settings_of_the_command_that_runs_are_checked_from_flags_too() {
        let check = |args: &[&str]| {
            Cli::try_parse_from([&["orders-api"], args].concat())
                .unwrap()
                .validate()
        };
        let too_long = "250000000000";
        assert!(check(&["serve", "--retention-secs", too_long]).is_err());
        assert!(check(&["--retention-secs", too_long]).is_err());
        assert!(check(&["serve", "--purge-interval-secs", &u64::MAX.to_string()]).is_err());
        assert_eq!(check(&["serve"]), Ok(()));
        assert_eq!(check(&["migrate"]), Ok(()));
    }

    #[test]
    fn each_commands_help_shows_only_what_it_uses() {
        let mut cli = Cli::command();
        for path in [
            &["migrate"][..],
            &["purge"],
            &["keys"],
            &["keys", "create"],
            &["keys", "revoke"],
        ] {
            let mut cmd = &mut cli;
            for name in path {
                cmd = cmd.find_subcommand_mut(name).expect("a subcommand");
            }
            let help = cmd.render_long_help().to_string();
            assert!(help.contains("--database-url"), "{path:?}: {help}");
            for server_flag in [
                "--bind",
                "--workers",
                "--cors-allowed-origins",
                "--lease-secs",
            ] {
                assert!(
                    !help.contains(server_flag),
                    "{path:?} shows {server_flag}: {help}"
                );
            }
        }
        let serve = cli.find_subcommand_mut("serve").expect("serve");
        assert!(serve.render_long_help().to_string().contains("--bind"));
    }

    #[test]
    fn durations_beyond_what_storage_and_timers_can_express_are_refused() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["orders-api"], args].concat())
                .unwrap()
                .settings
                .validate()
        };
        assert_eq!(parse(&[]), Ok(()));
        let max = MAX_RETENTION_SECS.to_string();
        assert_eq!(parse(&["--retention-secs", &max]), Ok(()));
        let too_long = parse(&["--retention-secs", "250000000000"]).unwrap_err();
        assert!(
            too_long.starts_with("IDEMPOTENCY_RETENTION_SECS") && !too_long.contains('\n'),
            "{too_long}"
        );
        assert!(parse(&["--retention-secs", &(MAX_RETENTION_SECS + 1).to_string()]).is_err());
        assert!(parse(&["--purge-interval-secs", &u64::MAX.to_string()]).is_err());
        assert!(Cli::try_parse_from(["orders-api", "--lease-secs", "86401"]).is_err());
    }

    #[test]
    fn a_retention_of_100_years_expires_in_a_four_digit_year() {
        let expiry = chrono::Utc::now()
            + chrono::Duration::seconds(i64::try_from(MAX_RETENTION_SECS).unwrap());
        assert!(expiry.format("%Y").to_string().len() == 4, "{expiry}");
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(parse(&["--database-url", "mysql://x"]).is_err());
        assert!(parse(&["--lease-secs", "0"]).is_err());
        assert!(parse(&["--cors-allowed-origins", "example.com"]).is_err());
        for refused in [
            "https://a:99999",
            "https://a:65536",
            "https://a:0",
            "https://a:-1",
            "https://a:",
            "https://user@a",
            "https://user:pw@a",
            "https://@a",
            "https://a/",
            "https://a/path",
            "https://a?q",
            "https://a#f",
            "https://a\\b",
            "https://",
            "https://a b",
            "ftp://a",
            "https:a",
            "//a",
        ] {
            let err = parse_origin(refused).unwrap_err();
            assert!(
                err.contains("is not an origin") && !err.contains('\n'),
                "{refused}: {err}"
            );
        }
        for (accepted, kept) in [
            ("https://a.example", "https://a.example"),
            ("https://a.example:1", "https://a.example:1"),
            ("http://a.example:65535", "http://a.example:65535"),
            ("HTTPS://A.Example", "https://a.example"),
            ("https://a.example:443", "https://a.example"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://[::1]:8080", "http://[::1]:8080"),
            (" * ", "*"),
        ] {
            assert_eq!(parse_origin(accepted).as_deref(), Ok(kept), "{accepted}");
        }
        // The replay memory: off at 0, at most a minute.
        assert!(parse(&["--replay-cache-secs", "0"]).is_ok());
        assert!(parse(&["--replay-cache-secs", "60"]).is_ok());
        assert!(parse(&["--replay-cache-secs", "61"]).is_err());
        assert!(
            parse(&[
                "serve",
                "--cors-allowed-origins",
                "https://a.example,http://b.example:8080"
            ])
            .is_ok()
        );
    }
}
