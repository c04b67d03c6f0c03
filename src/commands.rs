//! What each command does.

use std::io::Write;

use crate::auth::{self, KeyRef, Revocation};
use crate::cli::{Cli, Command, DatabaseArgs, KeysArgs, KeysCommand};
use crate::config::Settings;
use crate::db::{self, Pool};
use crate::startup::{self, Application};

/// A command's failure: one line for the user, no backtrace.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Setup(#[from] db::SetupError),
    #[error(transparent)]
    Bind(#[from] startup::BindError),
    #[error(transparent)]
    Serve(#[from] startup::ServeError),
    #[error(transparent)]
    Keys(#[from] auth::KeyAdminError),
    #[error("database error: {}", db::one_line(.0))]
    Database(String),
    #[error("no key matches {0}")]
    NoSuchKey(KeyRef),
    #[error("key {id} was already revoked at {}", .at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))]
    AlreadyRevoked {
        id: i64,
        at: chrono::DateTime<chrono::Utc>,
    },
    #[error("{count} active keys match {key}: revoke one by its id (see `orders-api keys list`)")]
    Ambiguous { key: KeyRef, count: usize },
    #[error("{0}")]
    Settings(String),
    #[error("cannot write the output: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Client(#[from] orders_client::command::ClientError),
    #[error(transparent)]
    Atk(#[from] orders_atk::AtkError),
}

impl CliError {
    /// The exit status it calls for: `atk history`'s `2` for a history that
    /// cannot be checked, `1` otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Atk(e) => e.exit_code(),
            _ => 1,
        }
    }
}

fn database_error(e: impl std::fmt::Display) -> CliError {
    CliError::Database(e.to_string())
}

/// Runs a command; what it prints for the user goes to stdout.
pub fn run(cli: Cli) -> Result<(), CliError> {
    execute(cli.into_command(), &mut std::io::stdout().lock())
}

/// Runs `command`, writing its output to `out`.
pub fn execute(command: Command, out: &mut dyn Write) -> Result<(), CliError> {
    match command {
        Command::Serve(settings) => {
            settings.validate().map_err(CliError::Settings)?;
            serve(&settings)
        }
        Command::Migrate(database) => {
            let applied = db::run_migrations(&database.database_url)?;
            tracing::info!(applied, "migrations applied");
            Ok(())
        }
        Command::Keys(keys_args) => keys(keys_args, out),
        Command::Purge(database) => {
            database
                .database_url
                .require_existing("`orders-api purge`")?;
            let pool = db::connect(&database.database_url, &database.one_connection())?;
            let purged = startup::purge_all(&pool).map_err(database_error)?;
            writeln!(out, "{purged}")?;
            Ok(())
        }
        Command::Client(args) => Ok(orders_client::command::run(args)?),
        Command::Atk(args) => Ok(orders_atk::run(&args)?),
    }
}

fn serve(settings: &Settings) -> Result<(), CliError> {
    let applied = db::run_migrations(&settings.database_url)?;
    let pool = db::connect(&settings.database_url, &settings.pool_options())?;
    actix_web::rt::System::new().block_on(async move {
        let app = Application::build(settings, pool.clone())?;
        // Only once the port is ours: a token printed by a server that then
        // failed to start would be lost, and never offered again.
        let demo_token = create_demo_key_if_none(&pool)?;
        tracing::info!(
            backend = ?settings.database_url.backend(),
            migrations_applied = applied,
            "listening on http://{}",
            local_addr(&settings.bind, app.port())
        );
        if let Some(token) = demo_token {
            // Directly to stderr, whatever the log level: a newcomer needs it once.
            let _ = writeln!(
                std::io::stderr(),
                "No API keys existed, so one was created for user 'demo':\n\n    {token}\n\n\
                 Try: curl -H 'Authorization: Bearer {token}' http://{}/v1/orders\n",
                local_addr(&settings.bind, app.port())
            );
        }
        let listening = format!(
            "listening on http://{}",
            local_addr(&settings.bind, app.port())
        );
        startup::notify_supervisor(&[
            startup::NotifyState::Ready,
            startup::NotifyState::Status(&listening),
        ]);
        app.run_until_stopped().await?;
        tracing::info!("stopped");
        Ok(())
    })
}

fn local_addr(bind: &str, port: u16) -> String {
    match bind.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{port}"),
        None => format!("{bind}:{port}"),
    }
}

fn create_demo_key_if_none(pool: &Pool) -> Result<Option<String>, CliError> {
    let mut pooled = pool.get().map_err(database_error)?;
    let mut conn = pooled.conn();
    if auth::any_exist(&mut conn).map_err(database_error)? {
        return Ok(None);
    }
    Ok(Some(auth::create(&mut conn, "demo")?))
}

fn keys(args: KeysArgs, out: &mut dyn Write) -> Result<(), CliError> {
    // The argument first: a bad one is refused before the database is opened.
    let key = match &args.command {
        KeysCommand::Create { user_id } => {
            auth::check_user_id(user_id)?;
            None
        }
        KeysCommand::List => None,
        KeysCommand::Revoke { token_or_id } => Some(KeyRef::parse(token_or_id)?),
    };
    let command = match &args.command {
        KeysCommand::List => {
            let keys = args
                .database
                .database_url
                .read_only("`orders-api keys list`", auth::list)?;
            return Ok(list_keys(&keys, out)?);
        }
        KeysCommand::Create { .. } => "`orders-api keys create`",
        KeysCommand::Revoke { .. } => "`orders-api keys revoke`",
    };
    args.database.database_url.require_existing(command)?;
    let pool = open(&args.database)?;
    let mut pooled = pool.get().map_err(database_error)?;
    let mut conn = pooled.conn();
    match (args.command, key) {
        (KeysCommand::Create { user_id }, _) => {
            let token = auth::create(&mut conn, &user_id)?;
            writeln!(out, "{token}")?;
        }
        // Answered above, on a read-only connection.
        (KeysCommand::List, _) => {}
        (KeysCommand::Revoke { .. }, Some(key)) => {
            match auth::revoke(&mut conn, &key).map_err(database_error)? {
                Revocation::Revoked { id, user_id } => {
                    writeln!(out, "revoked key {id} of user {user_id}")?;
                }
                Revocation::AlreadyRevoked { id, at } => {
                    return Err(CliError::AlreadyRevoked { id, at });
                }
                Revocation::NoMatch => return Err(CliError::NoSuchKey(key)),
                Revocation::Ambiguous(count) => return Err(CliError::Ambiguous { key, count }),
            }
        }
        (KeysCommand::Revoke { .. }, None) => {
            return Err(auth::KeyAdminError::BadKeyReference.into());
        }
    }
    Ok(())
}

/// Applies pending migrations to a database that exists (nothing is written
/// when none is pending) and opens one connection.
fn open(database: &DatabaseArgs) -> Result<Pool, CliError> {
    db::run_migrations(&database.database_url)?;
    Ok(db::connect(
        &database.database_url,
        &database.one_connection(),
    )?)
}

fn list_keys(keys: &[auth::ApiKeyInfo], out: &mut dyn Write) -> std::io::Result<()> {
    let time =
        |t: &chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    writeln!(
        out,
        "{:<6} {:<24} {:<14} {:<25} REVOKED",
        "ID", "USER", "PREFIX", "CREATED"
    )?;
    for k in keys {
        writeln!(
            out,
            "{:<6} {:<24} {:<14} {:<25} {}",
            k.id,
            k.user_id,
            format!("{}…", k.token_prefix),
            time(&k.created_at),
            k.revoked_at.as_ref().map(time).as_deref().unwrap_or("-")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use proptest::prelude::*;

    use super::*;
    use crate::db::DatabaseUrl;

    /// Runs `orders-api ARGS` in this process; its error as the user sees it.
    fn outcome(args: &[&str]) -> Result<(), String> {
        let argv = ["orders-api"].iter().chain(args).copied();
        let cli = Cli::try_parse_from(argv).map_err(|e| e.kind().to_string())?;
        execute(cli.into_command(), &mut Vec::new()).map_err(|e| e.to_string())
    }

    fn assert_one_line(result: Result<(), String>) -> Result<(), TestCaseError> {
        if let Err(message) = result {
            prop_assert_eq!(message.lines().count(), 1, "{:?}", message);
        }
        Ok(())
    }

    /// Any string, and strings near what the parsers look for.
    fn argument() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "oa_[0-9a-fA-F]{0,70}(…|\\.\\.\\.)?\\PC{0,3}",
            "[0-9]{1,25}",
            "\\PC{0,12}",
            "(sqlite:|postgres://|file:)?\\PC{0,20}",
            "[a-z]{1,8}=\\PC{0,10}( [a-z]{1,8}=\\PC{0,5})?",
        ]
    }

    #[test]
    fn no_argument_makes_a_keys_command_panic_and_every_error_is_one_line() {
        let path = std::env::temp_dir().join(format!(
            "orders-cli-props-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let db = path.display().to_string();
        // An existing database, so that valid arguments reach it.
        db::run_migrations(&DatabaseUrl::parse(&db).unwrap()).unwrap();
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(200));
        let result = runner.run(&argument(), |arg| {
            assert_one_line(outcome(&[
                "keys",
                "revoke",
                "--database-url",
                &db,
                "--",
                &arg,
            ]))?;
            assert_one_line(outcome(&[
                "keys",
                "create",
                "--database-url",
                &db,
                "--",
                &arg,
            ]))
        });
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{db}{suffix}"));
        }
        if let Err(e) = result {
            panic!("{e}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn no_database_url_makes_parsing_panic_and_every_refusal_is_one_line(raw in argument()) {
            if let Err(message) = DatabaseUrl::parse(&raw) {
                prop_assert_eq!(message.lines().count(), 1, "{:?}", message);
            }
            let _ = format!("{:?}", DatabaseUrl::parse(&raw));
        }
    }
}
