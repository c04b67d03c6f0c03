//! What each command does.

use std::io::Write;

use crate::auth;
use crate::config::{Cli, Command, KeysCommand, Settings};
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
    Keys(#[from] auth::KeyAdminError),
    #[error("database error: {0}")]
    Database(String),
    #[error("no active key matches {0}")]
    NoSuchKey(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Client(#[from] crate::client::command::ClientError),
    #[error(transparent)]
    Atk(#[from] crate::atk::AtkError),
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    let settings = cli.settings;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => serve(&settings),
        Command::Migrate => {
            let applied = db::run_migrations(&settings.database_url)?;
            tracing::info!(applied, "migrations applied");
            Ok(())
        }
        Command::Keys(command) => keys(&settings, command),
        Command::Purge => {
            let pool = Pool::connect(&settings.database_url, &one_connection(&settings))?;
            let purged =
                startup::purge_all(&pool).map_err(|e| CliError::Database(e.to_string()))?;
            println!("{purged}");
            Ok(())
        }
        Command::Client(args) => Ok(crate::client::command::run(args)?),
        Command::Atk(args) => Ok(crate::atk::run(&args)?),
    }
}

fn serve(settings: &Settings) -> Result<(), CliError> {
    let applied = db::run_migrations(&settings.database_url)?;
    let pool = Pool::connect(&settings.database_url, &settings.pool_options())?;
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
        app.run_until_stopped().await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// A one-shot command needs one connection, opened before it starts, and no
/// pool thread still connecting in the background when the process exits.
fn one_connection(settings: &Settings) -> db::PoolOptions {
    db::PoolOptions {
        max_size: 1,
        ..settings.pool_options()
    }
}

fn local_addr(bind: &str, port: u16) -> String {
    match bind.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{port}"),
        None => format!("{bind}:{port}"),
    }
}

fn create_demo_key_if_none(pool: &Pool) -> Result<Option<String>, CliError> {
    let mut pooled = pool.get().map_err(|e| CliError::Database(e.to_string()))?;
    let mut conn = pooled.conn();
    if auth::any_exist(&mut conn).map_err(|e| CliError::Database(e.to_string()))? {
        return Ok(None);
    }
    Ok(Some(auth::create(&mut conn, "demo")?))
}

fn keys(settings: &Settings, command: KeysCommand) -> Result<(), CliError> {
    db::run_migrations(&settings.database_url)?;
    let pool = Pool::connect(&settings.database_url, &one_connection(settings))?;
    let mut pooled = pool.get().map_err(|e| CliError::Database(e.to_string()))?;
    let mut conn = pooled.conn();
    let mut out = std::io::stdout().lock();
    match command {
        KeysCommand::Create { user_id } => {
            let token = auth::create(&mut conn, &user_id)?;
            writeln!(out, "{token}")?;
        }
        KeysCommand::List => {
            let keys = auth::list(&mut conn).map_err(|e| CliError::Database(e.to_string()))?;
            writeln!(
                out,
                "{:<6} {:<24} {:<14} {:<25} REVOKED",
                "ID", "USER", "PREFIX", "CREATED"
            )?;
            for k in keys {
                let revoked = k
                    .revoked_at
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                writeln!(
                    out,
                    "{:<6} {:<24} {:<14} {:<25} {}",
                    k.id,
                    k.user_id,
                    format!("{}…", k.token_prefix),
                    k.created_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    revoked.as_deref().unwrap_or("-")
                )?;
            }
        }
        KeysCommand::Revoke { token_or_id } => {
            if !auth::revoke(&mut conn, &token_or_id)
                .map_err(|e| CliError::Database(e.to_string()))?
            {
                return Err(CliError::NoSuchKey(if token_or_id.len() > 12 {
                    format!("{}…", &token_or_id[..12.min(token_or_id.len())])
                } else {
                    token_or_id
                }));
            }
            writeln!(out, "revoked")?;
        }
    }
    Ok(())
}
