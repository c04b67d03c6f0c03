//! The command line: the commands and the arguments each one takes. What
//! each command does is in [`crate::commands`]; the server's settings are
//! [`crate::config::Settings`].
//!
//! Each command declares the settings it uses, so its `--help` shows only
//! those: the server's on `serve` (and on the bare `orders-api`, which
//! serves), the database's on every command that opens the database. A new
//! command is one [`Command`] variant with its own `Args` struct, and one
//! match arm in [`crate::commands`].

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{
    DEFAULT_DATABASE_URL, DEFAULT_DB_TIMEOUT_SECS, DEFAULT_LEASE_SECS, DatabaseUrlParser, Settings,
};
use crate::db::{DatabaseUrl, PoolOptions};

/// What `orders-api --version` prints after the name: the version and the
/// commit the binary was built from (`unknown` outside a git checkout; see
/// `build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ORDERS_API_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "orders-api",
    version = VERSION,
    about = "An orders REST API in which every mutation is safe to retry",
    long_about = "An orders REST API in which every mutation is safe to retry.\n\n\
                  Without a command it serves, exactly as `orders-api serve`: the server's \
                  settings below belong to it. Other commands take their settings after \
                  their name: `orders-api keys list --database-url …`.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// The settings of the bare `orders-api`, which serves.
    #[command(flatten)]
    pub settings: Settings,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Apply pending migrations (creating the database when it does not exist), then serve HTTP
    /// until SIGINT/SIGTERM (the default).
    Serve(Settings),
    /// Apply pending migrations and exit, creating the database when it does not exist.
    Migrate(DatabaseArgs),
    /// Manage API keys, in a database that exists (`orders-api migrate` creates it).
    Keys(KeysArgs),
    /// Delete expired idempotency-ledger entries once and print how many (the database must
    /// exist).
    Purge(DatabaseArgs),
    /// The offline-first client: queue operations, send them with stored keys.
    Client(orders_client::command::ClientArgs),
    /// Run the attack scenarios (ATK-01 … ATK-12 and more) against a live server and report
    /// pass/fail/skip; `atk chaos` drives retrying clients through a fault-injecting proxy and
    /// checks their history, `atk history FILE` checks a recorded one.
    Atk(orders_atk::AtkArgs),
}

impl Cli {
    /// What to run: the bare `orders-api` serves.
    pub fn into_command(self) -> Command {
        self.command.unwrap_or(Command::Serve(self.settings))
    }

    /// [`Settings::validate`] on the settings of the command that runs,
    /// wherever each value came from (flag, environment or default): the
    /// bare command's own, or `serve`'s. Other commands use none of them.
    pub fn validate(&self) -> Result<(), String> {
        match &self.command {
            None => self.settings.validate(),
            Some(command) => command.validate(),
        }
    }
}

impl Command {
    /// The checks of the settings this command uses.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Command::Serve(settings) => settings.validate(),
            _ => Ok(()),
        }
    }
}

/// The database a one-shot command opens.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// sqlite://PATH (the default, embedded) or postgres://USER@HOST:PORT/DB.
    /// A SQLite URI filename (sqlite://file:PATH?…) takes mode=ro|rw|rwc and
    /// vfs=unix only; a query on a plain path, locking off and in-memory
    /// databases are refused.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, global = true,
          value_parser = DatabaseUrlParser, hide_env_values = true)]
    pub database_url: DatabaseUrl,
}

impl DatabaseArgs {
    /// One connection, opened before the command starts, with the server's
    /// default timeouts: no pool thread is still connecting when it exits.
    pub fn one_connection(&self) -> PoolOptions {
        PoolOptions {
            max_size: 1,
            connection_timeout: Duration::from_secs(DEFAULT_DB_TIMEOUT_SECS),
            lease: Duration::from_secs(DEFAULT_LEASE_SECS),
            write_queue: crate::db::writer::DEFAULT_QUEUE_CAPACITY,
            shown: self.database_url.to_string(),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum KeysCommand {
    /// Create an API key for USER_ID; prints only the token. Refuses a database that does not
    /// exist (`orders-api migrate` creates it).
    Create {
        /// The user the key acts for: 1 to 100 printable ASCII characters,
        /// without leading or trailing spaces.
        #[arg(value_name = "USER_ID")]
        user_id: String,
    },
    /// List keys: id, user, token prefix, created, revoked (never the token). Only reads: opens
    /// the database read-only, and refuses one that does not exist or is not migrated.
    List,
    /// Revoke a key, given its id or its prefix as `keys list` shows them, or its whole token.
    /// Refuses a database that does not exist.
    Revoke {
        /// The key's id (`7`), its prefix (`oa_1a2b3c4d`, as `keys list` shows it) or its
        /// whole token.
        #[arg(value_name = "TOKEN_OR_ID")]
        token_or_id: String,
    },
}
