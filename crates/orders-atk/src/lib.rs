//! `orders-api atk`: the attack scenarios of SPEC §5 against a live
//! deployment, judged over HTTP, reported pass / fail / skip with evidence.
//!
//! Each attack is defined once, in [`checks::ATTACKS`]; the integration suite
//! runs exactly these definitions against the server it spawns, so the
//! command and CI cannot drift apart.

pub mod checks;
pub mod probe;
mod report;
pub mod wire;

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

pub use checks::{ATTACKS, Attack, Needs};
pub use probe::{Exchange, Failure, Target, User};

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";
pub const DEFAULT_BASE_PATH: &str = "/v1/orders";
pub const DEFAULT_CONCURRENCY: usize = 50;

/// `orders-api atk`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AtkArgs {
    /// The deployment to attack (it writes to it: orders whose item is `atk-<run id>`).
    #[arg(long, default_value = DEFAULT_SERVER)]
    pub server: String,
    /// User A's bearer token; without one, the authenticated checks are skipped.
    #[arg(long, env = "ORDERS_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A second user's bearer token, for the tenancy checks (skipped without it).
    #[arg(long = "token-b", env = "ORDERS_API_TOKEN_B", hide_env_values = true)]
    pub token_b: Option<String>,
    /// Where the orders collection lives on the server.
    #[arg(long = "base-path", default_value = DEFAULT_BASE_PATH)]
    pub base_path: String,
    /// Run only these checks, e.g. `ATK-03,ATK-05`.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub only: Vec<String>,
    /// Concurrent requests in one round of the race (ATK-05).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub concurrency: u32,
    /// The report's format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the report to FILE (the text report then goes to stdout).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Leave the orders this run created as they are (default: cancel them at the end).
    #[arg(long)]
    pub keep: bool,
    /// Allow a server that is not on this machine (loopback).
    #[arg(long = "allow-remote")]
    pub allow_remote: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Junit,
}

/// Why the command did not pass: one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum AtkError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot reach {server}: {reason}")]
    Unreachable { server: String, reason: String },
    #[error("cannot write the report to {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{failed} of {total} checks failed")]
    Failed { failed: usize, total: usize },
}

/// How one check ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail { reason: String },
    Skip { reason: String },
}

/// One check's result and its evidence.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub id: &'static str,
    pub title: &'static str,
    pub sends: &'static str,
    pub expects: &'static str,
    #[serde(flatten)]
    pub outcome: Outcome,
    pub notes: Vec<String>,
    pub exchanges: Vec<Exchange>,
    /// Orders of this run the check created or was answered, by user.
    #[serde(skip)]
    pub orders: Vec<(User, String)>,
    pub millis: u128,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.outcome == Outcome::Pass
    }

    /// What the text report shows of this check: its reason, notes and exchanges.
    pub fn evidence(&self) -> String {
        report::evidence(self, "  ")
    }
}

impl Attack {
    /// Runs this attack against `target`, or says why it cannot.
    pub fn run(&'static self, target: &Target) -> CheckReport {
        let started = Instant::now();
        let mut report = CheckReport {
            id: self.id,
            title: self.title,
            sends: self.sends,
            expects: self.expects,
            outcome: Outcome::Pass,
            notes: Vec::new(),
            exchanges: Vec::new(),
            orders: Vec::new(),
            millis: 0,
        };
        if let Some(reason) = self.missing(target) {
            report.outcome = Outcome::Skip { reason };
            return report;
        }
        let mut probe = probe::Probe::new(target);
        let result = probe
            .take_baseline()
            .and_then(|()| (self.check)(&mut probe));
        if let Err(Failure(reason)) = result {
            report.outcome = Outcome::Fail { reason };
        }
        // Whatever the check saw, and whatever the listing shows now, is cleaned up later.
        let mut orders = probe.seen.clone();
        for user in [User::A, User::B] {
            if let Ok(created) = probe.new_orders(user) {
                orders.extend(
                    created
                        .iter()
                        .filter_map(|o| o.get("id")?.as_str())
                        .map(|id| (user, id.to_owned())),
                );
            }
            if self.needs == Needs::Token {
                break;
            }
        }
        report.orders = orders.into_iter().collect();
        report.notes = probe.notes;
        report.exchanges = probe.exchanges;
        report.millis = started.elapsed().as_millis();
        report
    }

    /// Why this attack cannot run against `target`, if it cannot.
    fn missing(&self, target: &Target) -> Option<String> {
        if target.token.is_none() {
            return Some(
                "no --token (ORDERS_API_TOKEN): this check sends authenticated requests".into(),
            );
        }
        if self.needs == Needs::TwoUsers && target.token_b.is_none() {
            return Some(
                "no --token-b (ORDERS_API_TOKEN_B): the tenancy checks need a second user's token"
                    .into(),
            );
        }
        None
    }
}

/// The attack with this id (case-insensitive).
pub fn find(id: &str) -> Option<&'static Attack> {
    ATTACKS
        .iter()
        .find(|a| a.id.eq_ignore_ascii_case(id.trim()))
}

/// A whole run: every selected check, then the cleanup.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub server: String,
    pub base_path: String,
    pub run_id: String,
    pub item: String,
    pub checks: Vec<CheckReport>,
    pub cleanup: Cleanup,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub millis: u128,
}

/// What happened to the orders this run created.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cleanup {
    /// The orders were left as they are (`--keep`).
    pub kept: bool,
    pub orders: usize,
    pub cancelled: usize,
    /// Cancels that did not answer 200: `id: status`.
    pub problems: Vec<String>,
}

impl RunReport {
    /// `N passed, N failed, N skipped`.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// Runs `attacks` against `target` in order, then cancels the orders they
/// created unless `keep`.
pub fn run_attacks(target: &Target, attacks: &[&'static Attack], keep: bool) -> RunReport {
    let started = Instant::now();
    let checks: Vec<CheckReport> = attacks.iter().map(|a| a.run(target)).collect();
    let mut orders: Vec<(User, String)> = checks
        .iter()
        .flat_map(|c| c.orders.iter().cloned())
        .collect();
    orders.sort();
    orders.dedup();
    let cleanup = if keep {
        Cleanup {
            kept: true,
            orders: orders.len(),
            ..Cleanup::default()
        }
    } else {
        cancel_all(target, &orders)
    };
    let count = |f: fn(&Outcome) -> bool| checks.iter().filter(|c| f(&c.outcome)).count();
    RunReport {
        server: target.server.clone(),
        base_path: target.base_path.clone(),
        run_id: target.run_id.clone(),
        item: target.item(),
        passed: count(|o| matches!(o, Outcome::Pass)),
        failed: count(|o| matches!(o, Outcome::Fail { .. })),
        skipped: count(|o| matches!(o, Outcome::Skip { .. })),
        checks,
        cleanup,
        millis: started.elapsed().as_millis(),
    }
}

/// Cancels each order as its owner, with a key of this run.
fn cancel_all(target: &Target, orders: &[(User, String)]) -> Cleanup {
    let agent = target.agent();
    let mut cleanup = Cleanup {
        orders: orders.len(),
        ..Cleanup::default()
    };
    for (user, id) in orders {
        let token = match user {
            User::A => target.token.as_deref(),
            User::B => target.token_b.as_deref(),
        };
        let Some(token) = token else { continue };
        let headers = [
            ("Authorization".to_owned(), format!("Bearer {token}")),
            (
                "Idempotency-Key".to_owned(),
                format!("atk-{}-cancel-{id}", target.run_id),
            ),
        ];
        let url = format!("{}{}/{id}", target.server, target.base_path);
        match probe::request(&agent, "DELETE", &url, &headers, None) {
            Ok(r) if r.status == 200 => cleanup.cancelled += 1,
            Ok(r) => cleanup.problems.push(format!("{id}: {}", r.brief())),
            Err(e) => cleanup.problems.push(format!("{id}: {e}")),
        }
    }
    cleanup
}

/// `orders-api atk`: checks the flags, runs, reports; `Err` when a check
/// failed or the run could not start.
pub fn run(args: &AtkArgs) -> Result<(), AtkError> {
    let target = target_of(args)?;
    let attacks = select(&args.only)?;
    reachable(&target)?;
    let report = run_attacks(&target, &attacks, args.keep);

    let rendered = report::render(&report, args.format);
    let mut stdout = std::io::stdout().lock();
    let stdout_error = |source| AtkError::Write {
        path: "stdout".into(),
        source,
    };
    match &args.out {
        Some(path) => {
            std::fs::write(path, rendered).map_err(|source| AtkError::Write {
                path: path.display().to_string(),
                source,
            })?;
            let text = report::render(&report, Format::Text);
            stdout.write_all(text.as_bytes()).map_err(stdout_error)?;
            writeln!(stdout, "report written to {}", path.display()).map_err(stdout_error)?;
        }
        None => stdout
            .write_all(rendered.as_bytes())
            .map_err(stdout_error)?,
    }
    stdout.flush().map_err(stdout_error)?;
    if report.failed > 0 {
        return Err(AtkError::Failed {
            failed: report.failed,
            total: report.checks.len(),
        });
    }
    Ok(())
}

fn target_of(args: &AtkArgs) -> Result<Target, AtkError> {
    let server = args.server.trim().trim_end_matches('/');
    let uri: ureq::http::Uri = server
        .parse()
        .map_err(|e| AtkError::Usage(format!("--server {server}: not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(AtkError::Usage(format!(
                "--server {server}: this build speaks plain http only (no TLS); \
                 attack an http:// address, e.g. through a port-forward"
            )));
        }
        _ => {
            return Err(AtkError::Usage(format!(
                "--server {server}: expected http://host[:port]"
            )));
        }
    }
    let host = uri
        .host()
        .ok_or_else(|| AtkError::Usage(format!("--server {server}: no host")))?;
    if !args.allow_remote && !is_loopback(host) {
        return Err(AtkError::Usage(format!(
            "--server {server} is not on this machine, and atk writes to its target: \
             pass --allow-remote to attack it anyway"
        )));
    }
    let base_path = args.base_path.trim().trim_end_matches('/');
    if !base_path.starts_with('/') {
        return Err(AtkError::Usage(format!(
            "--base-path {base_path}: must start with /"
        )));
    }
    let mut target = Target::new(server);
    target.base_path = base_path.to_owned();
    target.token = args.token.clone().filter(|t| !t.trim().is_empty());
    target.token_b = args.token_b.clone().filter(|t| !t.trim().is_empty());
    target.concurrency = args.concurrency as usize;
    Ok(target)
}

/// `localhost`, `*.localhost`, 127.0.0.0/8 or `::1`.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The attacks `--only` names, in their usual order (all when empty).
fn select(only: &[String]) -> Result<Vec<&'static Attack>, AtkError> {
    if only.is_empty() {
        return Ok(ATTACKS.iter().collect());
    }
    for id in only {
        if find(id).is_none() {
            let known: Vec<&str> = ATTACKS.iter().map(|a| a.id).collect();
            return Err(AtkError::Usage(format!(
                "--only: no check {id}; known: {}",
                known.join(", ")
            )));
        }
    }
    Ok(ATTACKS
        .iter()
        .filter(|a| only.iter().any(|id| a.id.eq_ignore_ascii_case(id.trim())))
        .collect())
}

/// Fails when the server gives no HTTP answer at all.
fn reachable(target: &Target) -> Result<(), AtkError> {
    let url = format!("{}{}", target.server, target.base_path);
    probe::request(&target.agent(), "GET", &url, &[], None)
        .map(|_| ())
        .map_err(|reason| AtkError::Unreachable {
            server: target.server.clone(),
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        atk: AtkArgs,
    }

    fn args(flags: &[&str]) -> AtkArgs {
        Cli::try_parse_from(std::iter::once("atk").chain(flags.iter().copied()))
            .unwrap()
            .atk
    }

    #[test]
    fn the_defaults_are_those_of_the_issue() {
        let a = args(&[]);
        assert_eq!(a.server, "http://127.0.0.1:8080");
        assert_eq!(a.base_path, "/v1/orders");
        assert_eq!(a.concurrency, 50);
        assert_eq!(a.format, Format::Text);
        assert!(!a.keep && !a.allow_remote && a.only.is_empty());
    }

    #[test]
    fn a_remote_server_is_refused_without_allow_remote() {
        for server in ["http://10.0.0.5:8080", "http://staging.example.com"] {
            let refused = target_of(&args(&["--server", server])).unwrap_err();
            assert!(refused.to_string().contains("--allow-remote"), "{refused}");
            assert!(target_of(&args(&["--server", server, "--allow-remote"])).is_ok());
        }
        for server in [
            "http://127.0.0.1:1",
            "http://localhost:8080/",
            "http://[::1]:8080",
        ] {
            assert!(target_of(&args(&["--server", server])).is_ok(), "{server}");
        }
    }

    #[test]
    fn only_takes_known_ids_and_keeps_the_usual_order() {
        let picked = select(&["atk-05".into(), "ATK-03".into()]).unwrap();
        assert_eq!(
            picked.iter().map(|a| a.id).collect::<Vec<_>>(),
            ["ATK-03", "ATK-05"]
        );
        assert!(select(&["ATK-99".into()]).is_err());
    }

    #[test]
    fn every_attack_of_spec_section_5_is_defined_once() {
        for n in 1..=12 {
            let id = format!("ATK-{n:02}");
            assert_eq!(ATTACKS.iter().filter(|a| a.id == id).count(), 1, "{id}");
        }
        let mut ids: Vec<&str> = ATTACKS.iter().map(|a| a.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), ATTACKS.len());
    }

    #[test]
    fn without_tokens_every_check_is_skipped_with_its_reason() {
        let target = Target::new("http://127.0.0.1:1");
        let report = run_attacks(&target, &ATTACKS.iter().collect::<Vec<_>>(), false);
        assert_eq!(report.skipped, ATTACKS.len());
        assert_eq!(
            report.summary(),
            format!("0 passed, 0 failed, {} skipped", ATTACKS.len())
        );
        for check in &report.checks {
            assert!(
                matches!(&check.outcome, Outcome::Skip { reason } if reason.contains("--token")),
                "{check:?}"
            );
        }
    }
}
