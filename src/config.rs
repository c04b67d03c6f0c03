//! Command line and settings. Every setting is a flag and an environment
//! variable; a flag wins.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::db::{DatabaseUrl, PoolOptions};
use crate::idempotency::Ledger;

#[derive(Debug, Parser)]
#[command(
    name = "orders-api",
    version,
    about = "An orders REST API in which every mutation is safe to retry"
)]
pub struct Cli {
    #[command(flatten)]
    pub settings: Settings,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Apply pending migrations, then serve HTTP until SIGINT/SIGTERM (the default).
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Delete expired idempotency-ledger entries once and print how many.
    Purge,
    /// Run the attack scenarios (SPEC §5) against a live server and report pass/fail/skip.
    Atk(crate::atk::AtkArgs),
}

#[derive(Debug, Clone, Subcommand)]
pub enum KeysCommand {
    /// Create an API key for USER_ID; prints only the token.
    Create {
        #[arg(value_name = "USER_ID")]
        user_id: String,
    },
    /// List keys: id, user, token prefix, created, revoked (never the token).
    List,
    /// Revoke a key, given its whole token or its id.
    Revoke {
        #[arg(value_name = "TOKEN_OR_ID")]
        token_or_id: String,
    },
}

#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// sqlite://PATH (the default, embedded) or postgres://USER@HOST/DB.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://orders.db", global = true, value_parser = DatabaseUrl::parse)]
    pub database_url: DatabaseUrl,

    /// Address to listen on (port 0 picks a free port).
    #[arg(
        long = "bind",
        env = "BIND_ADDR",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub bind: String,

    /// How long a recorded response is replayed, in seconds.
    #[arg(long = "retention-secs", env = "IDEMPOTENCY_RETENTION_SECS", default_value_t = 86_400, global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_secs: u64,

    /// How long one request may hold its key's claim, in seconds.
    #[arg(long = "lease-secs", env = "IDEMPOTENCY_LEASE_SECS", default_value_t = 30, global = true,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub lease_secs: u64,

    /// How often expired ledger entries are purged, in seconds.
    #[arg(long = "purge-interval-secs", env = "PURGE_INTERVAL_SECS", default_value_t = 300, global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub purge_interval_secs: u64,

    /// The largest request body accepted, in bytes.
    #[arg(long = "max-body-bytes", env = "MAX_BODY_BYTES", default_value_t = 65_536, global = true,
          value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub max_body_bytes: u64,

    /// Comma-separated origins allowed cross-origin access (`*` for any); empty: none.
    #[arg(long = "cors-allowed-origins", env = "CORS_ALLOWED_ORIGINS", default_value = "", global = true,
          value_delimiter = ',', value_parser = parse_origin)]
    pub cors_allowed_origins: Vec<String>,

    /// Connections in the database pool of this process.
    #[arg(long = "pool-size", env = "DATABASE_POOL_SIZE", default_value_t = 10, global = true,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_size: u32,

    /// How long a request waits for a database connection before a 503, in seconds.
    #[arg(long = "db-timeout-secs", env = "DATABASE_TIMEOUT_SECS", default_value_t = 3, global = true,
          value_parser = clap::value_parser!(u64).range(1..=60))]
    pub db_timeout_secs: u64,

    /// How long a process keeps accepting a token the database accepted, in
    /// seconds: a revoked key stops working within this time (0: look every
    /// token up on every request).
    #[arg(long = "auth-cache-secs", env = "AUTH_CACHE_SECS", default_value_t = 1, global = true,
          value_parser = clap::value_parser!(u64).range(0..=60))]
    pub auth_cache_secs: u64,

    /// SQLite: how many writes may wait for the group-commit writer before
    /// further ones are answered 503 with Retry-After.
    #[arg(long = "write-queue", env = "SQLITE_WRITE_QUEUE", default_value_t = 4_096, global = true,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub write_queue: u32,

    /// HTTP worker threads (default: one per CPU core).
    #[arg(long = "workers", env = "HTTP_WORKERS", global = true, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: Option<u16>,
}

/// An origin as browsers send it: `scheme://host[:port]`, or `*`.
fn parse_origin(raw: &str) -> Result<String, String> {
    let origin = raw.trim();
    if origin.is_empty() || origin == "*" {
        return Ok(origin.to_owned());
    }
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| format!("'{origin}' is not an origin: expected http(s)://host[:port]"))?;
    if rest.is_empty()
        || rest.contains(['/', '?', '#', ' '])
        || origin.parse::<actix_web::http::Uri>().is_err()
    {
        return Err(format!(
            "'{origin}' is not an origin: expected http(s)://host[:port]"
        ));
    }
    Ok(origin.to_owned())
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
            lease_secs: 30,
            purge_interval_secs: 300,
            max_body_bytes: 65_536,
            cors_allowed_origins: Vec::new(),
            pool_size: 10,
            db_timeout_secs: 3,
            auth_cache_secs: 1,
            write_queue: 4_096,
            workers: None,
        }
    }

    pub fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            max_size: self.pool_size,
            connection_timeout: Duration::from_secs(self.db_timeout_secs),
            lease: Duration::from_secs(self.lease_secs),
            write_queue: usize::try_from(self.write_queue).unwrap_or(usize::MAX),
        }
    }

    pub fn ledger(&self) -> Ledger {
        Ledger {
            retention: Duration::from_secs(self.retention_secs),
            lease: Duration::from_secs(self.lease_secs),
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
    use super::*;

    #[test]
    fn the_defaults_are_those_of_the_contract() {
        let cli = Cli::try_parse_from(["orders-api"]).unwrap();
        let s = cli.settings;
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
        assert!(cli.command.is_none());
    }

    #[test]
    fn flags_are_accepted_after_a_subcommand() {
        let cli = Cli::try_parse_from([
            "orders-api",
            "keys",
            "create",
            "alice",
            "--database-url",
            "sqlite://x.db",
        ])
        .unwrap();
        assert_eq!(cli.settings.database_url.as_str(), "x.db");
        assert!(
            matches!(cli.command, Some(Command::Keys(KeysCommand::Create { ref user_id })) if user_id == "alice")
        );
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
        assert!(Cli::try_parse_from(["orders-api", "--database-url", "mysql://x"]).is_err());
        assert!(Cli::try_parse_from(["orders-api", "--lease-secs", "0"]).is_err());
        assert!(
            Cli::try_parse_from(["orders-api", "--cors-allowed-origins", "example.com"]).is_err()
        );
        assert!(
            Cli::try_parse_from([
                "orders-api",
                "--cors-allowed-origins",
                "https://a.example,http://b.example:8080"
            ])
            .is_ok()
        );
    }
}
