//! `orders-api atk`: the attack scenarios of CONTRACT §5 against a live
//! deployment of the Idempotency-Key pattern — this service or any other
//! implementation, of any order shape, with or without authentication.
//! Each check first makes sure the target accepts a valid request (its
//! control), then judges what the attack achieved: BLOCKED (nothing),
//! EXPOSED (the evidence says what), or not run with the reason; a blocked
//! attack refused otherwise than this contract says carries a deviation.
//!
//! Each attack is defined once, in [`checks::ATTACKS`]; the integration suite
//! runs exactly these definitions against the server it spawns, so the
//! command and CI cannot drift apart.
//!
//! Two more commands judge a service by its history instead of one attack
//! at a time: [`history`] checks a history recorded by any tool, and
//! [`chaos`] records one through its own fault-injecting proxy, with
//! retrying clients, and checks it.

pub mod chaos;
pub mod checks;
pub mod history;
pub mod internals;
pub mod invariants;
mod output;
pub mod probe;
mod report;
pub mod shape;
pub mod wire;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

pub use checks::{ATTACKS, Attack, Needs};
pub use probe::{CannotJudge, Exchange, Target, User};
pub use shape::Shape;

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";
pub const DEFAULT_BASE_PATH: &str = "/v1/orders";
pub const DEFAULT_CONCURRENCY: usize = 50;

/// `orders-api atk`'s flags: the attack scenarios, or one of its commands.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AtkArgs {
    /// `chaos` or `history`; without one, the attack scenarios run.
    #[command(subcommand)]
    pub command: Option<AtkCommand>,
    /// The deployment to attack (it writes to it: orders whose item is `atk-<run id>`).
    #[arg(long, default_value = DEFAULT_SERVER)]
    pub server: String,
    /// User A's bearer token; without one, requests carry no Authorization
    /// (for a target without authentication).
    #[arg(long, env = "ORDERS_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A second user's bearer token, for the tenancy checks (skipped without it).
    #[arg(long = "token-b", env = "ORDERS_API_TOKEN_B", hide_env_values = true)]
    pub token_b: Option<String>,
    /// The target's shape: `orders-api` (this API, the default), `seed`
    /// (`/orders`, no auth, integer ids), or a JSON profile file.
    #[arg(long, value_name = "NAME|FILE")]
    pub profile: Option<String>,
    /// Where the orders collection lives [default: the profile's, /v1/orders].
    #[arg(long = "base-path", value_name = "PATH")]
    pub base_path: Option<String>,
    /// The order member that holds its id [default: the profile's, id].
    #[arg(long = "id-field", value_name = "NAME")]
    pub id_field: Option<String>,
    /// The order member that holds its item [default: the profile's, item].
    #[arg(long = "item-field", value_name = "NAME")]
    pub item_field: Option<String>,
    /// The order member that holds its quantity [default: the profile's, quantity].
    #[arg(long = "quantity-field", value_name = "NAME")]
    pub quantity_field: Option<String>,
    /// The order member that holds its price [default: the profile's, price].
    #[arg(long = "price-field", value_name = "NAME")]
    pub price_field: Option<String>,
    /// Run only these checks, e.g. `ATK-03,ATK-05`.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub only: Vec<String>,
    /// Concurrent requests in one round of the race (ATK-05).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub concurrency: u32,
    /// Fail the run on a deviation from this contract too, not only on an exposure.
    #[arg(long)]
    pub strict: bool,
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

/// The commands of `orders-api atk` besides the attack scenarios.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AtkCommand {
    /// Drive retrying clients through a fault-injecting proxy, record the
    /// history and check it (exit 0 only when something was acknowledged
    /// and the history is consistent).
    Chaos(Box<chaos::ChaosArgs>),
    /// Check a recorded history (JSON Lines, Jepsen's shape) against the
    /// idempotency contract: exit 0 consistent, 1 inconsistent, 2 malformed.
    History(history::HistoryArgs),
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
    #[error("{exposed} of {total} checks EXPOSED: {ids}")]
    Exposed {
        exposed: usize,
        total: usize,
        ids: String,
    },
    #[error("no check could run, nothing was judged: {reason}")]
    NothingRan { reason: String },
    #[error("{deviations} deviation(s) from the contract (--strict): {ids}")]
    Deviations { deviations: usize, ids: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{file} is not a history that can be checked: {malformed}")]
    Malformed {
        file: String,
        malformed: history::Malformed,
    },
    #[error("the history is inconsistent: {violations} violation(s) of {rules}")]
    Inconsistent { violations: usize, rules: String },
    #[error("nothing was acknowledged, so nothing was judged: {reason}")]
    NothingAcknowledged { reason: String },
    #[error("the run cannot be judged: {0}")]
    CannotJudge(String),
}

impl AtkError {
    /// The exit status it calls for: `2` when a history cannot be read or
    /// is malformed, `1` for everything else that fails a run.
    pub fn exit_code(&self) -> u8 {
        match self {
            AtkError::Read { .. } | AtkError::Malformed { .. } => 2,
            _ => 1,
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The attack achieved nothing.
    Blocked,
    /// The attack achieved something: each entry says what.
    Exposed { exposed: Vec<String> },
    /// The check could not judge: its control failed, or the target gave
    /// no way to tell what the attack did.
    NotRun { reason: String },
    /// The check does not apply to this run (the tenancy checks without a
    /// second user).
    Skipped { reason: String },
}

impl Verdict {
    /// `BLOCKED`, `EXPOSED`, `NOT RUN`, `SKIPPED`.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Blocked => "BLOCKED",
            Verdict::Exposed { .. } => "EXPOSED",
            Verdict::NotRun { .. } => "NOT RUN",
            Verdict::Skipped { .. } => "SKIPPED",
        }
    }
}

/// One check's result and its evidence.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub id: &'static str,
    pub title: &'static str,
    pub sends: &'static str,
    pub expects: &'static str,
    pub exposed_if: &'static str,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Where a blocked attack was answered otherwise than this contract.
    pub deviations: Vec<String>,
    pub notes: Vec<String>,
    /// Every request of the check (its control's included) that got no
    /// whole answer, with why. The verdict never drops the target's state
    /// for them; a check that could not be judged without one says which.
    pub unanswered: Vec<String>,
    /// The control's requests and answers (a valid create with a fresh key).
    pub control: Vec<Exchange>,
    /// The attack's requests and answers.
    pub exchanges: Vec<Exchange>,
    /// Orders of this run the check created or was answered, by user.
    #[serde(skip)]
    pub orders: Vec<(User, String)>,
    pub millis: u128,
}

impl CheckReport {
    pub fn blocked(&self) -> bool {
        self.verdict == Verdict::Blocked
    }

    pub fn exposed(&self) -> bool {
        matches!(self.verdict, Verdict::Exposed { .. })
    }

    /// What the text report shows of this check: its verdict's reasons,
    /// deviations, notes and exchanges.
    pub fn evidence(&self) -> String {
        report::evidence(self, "  ")
    }
}

impl Attack {
    /// Runs this attack against `target`: its control, then the attack, then
    /// the verdict.
    pub fn run(&'static self, target: &Target) -> CheckReport {
        let started = Instant::now();
        let mut report = CheckReport {
            id: self.id,
            title: self.title,
            sends: self.sends,
            expects: self.expects,
            exposed_if: self.exposed_if,
            verdict: Verdict::Blocked,
            deviations: Vec::new(),
            notes: Vec::new(),
            unanswered: Vec::new(),
            control: Vec::new(),
            exchanges: Vec::new(),
            orders: Vec::new(),
            millis: 0,
        };
        let users: &[User] = match self.needs {
            Needs::OneUser => &[User::A],
            Needs::TwoUsers => &[User::A, User::B],
        };
        if !self.tries.is_empty() && self.tries.iter().all(|r| !target.shape.has(r)) {
            report.verdict = Verdict::Skipped {
                reason: format!(
                    "the profile says the target lacks {}, every route this check tries",
                    self.tries.join(", ")
                ),
            };
            return report;
        }
        if self.needs == Needs::TwoUsers && (target.token.is_none() || target.token_b.is_none()) {
            report.verdict = Verdict::Skipped {
                reason: "the tenancy checks need two users of the target: --token \
                         (ORDERS_API_TOKEN) and --token-b (ORDERS_API_TOKEN_B)"
                    .into(),
            };
            return report;
        }
        let mut probe = probe::Probe::new(target);
        let judged = probe
            .control(users, &self.id.to_ascii_lowercase())
            .map_err(|CannotJudge(why)| why)
            .and_then(|()| {
                (self.check)(&mut probe)
                    .map_err(|CannotJudge(why)| format!("the attack could not be judged: {why}"))
            });
        report.verdict = match (probe.exposures.is_empty(), judged) {
            (false, _) => Verdict::Exposed {
                exposed: std::mem::take(&mut probe.exposures),
            },
            (true, Err(reason)) => Verdict::NotRun { reason },
            (true, Ok(())) => Verdict::Blocked,
        };
        // Whatever the check saw, and whatever the listing shows now, is cleaned up later.
        let mut orders = probe.seen.clone();
        for &user in users {
            if probe.lists(user)
                && let Ok(ids) = probe.run_order_ids(user)
            {
                orders.extend(ids.into_iter().map(|id| (user, id)));
            }
        }
        report.orders = orders.into_iter().collect();
        report.deviations = probe.deviations;
        report.notes = probe.notes;
        report.unanswered = probe.unanswered;
        report.control = probe.control;
        report.exchanges = probe.exchanges;
        report.millis = started.elapsed().as_millis();
        report
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
    pub shape: Shape,
    pub authenticated: bool,
    pub strict: bool,
    pub run_id: String,
    pub item: String,
    pub checks: Vec<CheckReport>,
    pub cleanup: Cleanup,
    pub blocked: usize,
    pub exposed: usize,
    pub not_run: usize,
    pub skipped: usize,
    /// Deviation notes of all checks.
    pub deviations: usize,
    pub millis: u128,
}

/// What happened to the orders this run created.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cleanup {
    /// The orders were left as they are (`--keep`).
    pub kept: bool,
    pub orders: usize,
    pub cancelled: usize,
    /// Cancels that did not answer 2xx: `id: status`.
    pub problems: Vec<String>,
    /// Why no order was cancelled, when none could be (the target lacks `DELETE`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_tried: Option<String>,
}

impl RunReport {
    /// `N blocked, N exposed, N not run, N skipped, N deviations`.
    pub fn summary(&self) -> String {
        format!(
            "{} blocked, {} exposed, {} not run, {} skipped, {} deviations",
            self.blocked, self.exposed, self.not_run, self.skipped, self.deviations
        )
    }

    /// `Ok` when at least one check ran and none was exposed (and, when
    /// `strict`, none deviated); else why not.
    pub fn outcome(&self) -> Result<(), AtkError> {
        let ids = |keep: fn(&CheckReport) -> bool| {
            self.checks
                .iter()
                .filter(|c| keep(c))
                .map(|c| c.id)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if self.exposed > 0 {
            return Err(AtkError::Exposed {
                exposed: self.exposed,
                total: self.checks.len(),
                ids: ids(CheckReport::exposed),
            });
        }
        if self.blocked == 0 {
            let first = self.checks.iter().find_map(|c| match &c.verdict {
                Verdict::NotRun { reason } => Some(format!("{}: {reason}", c.id)),
                _ => None,
            });
            let first = first.or_else(|| {
                self.checks.iter().find_map(|c| match &c.verdict {
                    Verdict::Skipped { reason } => Some(format!("{}: {reason}", c.id)),
                    _ => None,
                })
            });
            return Err(AtkError::NothingRan {
                reason: format!(
                    "{} not run, {} skipped; {}",
                    self.not_run,
                    self.skipped,
                    first.unwrap_or_else(|| "no check selected".into())
                ),
            });
        }
        if self.strict && self.deviations > 0 {
            return Err(AtkError::Deviations {
                deviations: self.deviations,
                ids: ids(|c| !c.deviations.is_empty()),
            });
        }
        Ok(())
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
    // Numeric ids in their order (2 before 10), others as text.
    orders.sort_by(|(u, a), (v, b)| (u, a.len(), a).cmp(&(v, b.len(), b)));
    orders.dedup();
    let cleanup = if keep {
        Cleanup {
            kept: true,
            orders: orders.len(),
            ..Cleanup::default()
        }
    } else if !target.shape.has("DELETE") {
        Cleanup {
            orders: orders.len(),
            not_tried: Some("the profile says the target lacks DELETE".into()),
            ..Cleanup::default()
        }
    } else {
        cancel_all(target, &orders)
    };
    let count = |f: fn(&Verdict) -> bool| checks.iter().filter(|c| f(&c.verdict)).count();
    RunReport {
        server: target.server.clone(),
        shape: target.shape.clone(),
        authenticated: target.token.is_some(),
        strict: false,
        run_id: target.run_id.clone(),
        item: target.item(),
        blocked: count(|v| matches!(v, Verdict::Blocked)),
        exposed: count(|v| matches!(v, Verdict::Exposed { .. })),
        not_run: count(|v| matches!(v, Verdict::NotRun { .. })),
        skipped: count(|v| matches!(v, Verdict::Skipped { .. })),
        deviations: checks.iter().map(|c| c.deviations.len()).sum(),
        checks,
        cleanup,
        millis: started.elapsed().as_millis(),
    }
}

/// Cancels each order as its owner (without `Authorization` on a target
/// without authentication), with a key of this run.
fn cancel_all(target: &Target, orders: &[(User, String)]) -> Cleanup {
    let agent = target.agent();
    let mut cleanup = Cleanup {
        orders: orders.len(),
        ..Cleanup::default()
    };
    for (user, id) in orders {
        let mut headers = vec![(
            target.shape.key_header.clone(),
            format!("atk-{}-cancel-{id}", target.run_id),
        )];
        if let Some(token) = target.token_of(*user) {
            headers.push(("Authorization".to_owned(), format!("Bearer {token}")));
        }
        let path = target.order_path(id);
        let url = format!("{}{path}", target.server);
        match probe::request(&agent, "DELETE", &url, &headers, None) {
            Ok(r) if r.success() => cleanup.cancelled += 1,
            Ok(r) => {
                // The same answer for every order reads as one.
                let answer = r.brief().replace(&path, &target.shape.order("{id}"));
                cleanup.problems.push(format!("{id}: {answer}"));
            }
            Err(e) => cleanup.problems.push(format!("{id}: {e}")),
        }
    }
    cleanup
}

/// `orders-api atk`: checks the flags, runs, reports; `Err` when an attack
/// was exposed, nothing could run, or (with `--strict`) a check deviated.
/// With a command, that command ([`chaos::run`], [`history::run`]).
pub fn run(args: &AtkArgs) -> Result<(), AtkError> {
    match &args.command {
        Some(AtkCommand::Chaos(chaos)) => return chaos::run(chaos),
        Some(AtkCommand::History(history)) => return history::run(history),
        None => {}
    }
    let target = target_of(args)?;
    let attacks = select(&args.only)?;
    reachable(&target)?;
    let mut report = run_attacks(&target, &attacks, args.keep);
    report.strict = args.strict;

    output::emit(
        &report::render(&report, Format::Text),
        &|format| report::render(&report, format),
        args.format,
        args.out.as_deref(),
    )?;
    report.outcome()
}

/// The target the flags describe: the profile's shape, each field flag over it.
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
    let mut shape = match &args.profile {
        Some(profile) => Shape::profile(profile.trim()).map_err(AtkError::Usage)?,
        None => Shape::default(),
    };
    for (flag, field) in [
        (&args.base_path, &mut shape.base_path),
        (&args.id_field, &mut shape.id_field),
        (&args.item_field, &mut shape.item_field),
        (&args.quantity_field, &mut shape.quantity_field),
        (&args.price_field, &mut shape.price_field),
    ] {
        if let Some(value) = flag {
            value.trim().clone_into(field);
        }
    }
    let mut target = Target::new(server);
    target.shape = shape.checked().map_err(AtkError::Usage)?;
    target.token = args.token.clone().filter(|t| !t.trim().is_empty());
    target.token_b = args.token_b.clone().filter(|t| !t.trim().is_empty());
    target.concurrency = args.concurrency as usize;
    Ok(target)
}

/// `localhost`, `*.localhost`, 127.0.0.0/8 or `::1`.
pub(crate) fn is_loopback(host: &str) -> bool {
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
    let url = format!("{}{}", target.server, target.base_path());
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
        assert_eq!(a.concurrency, 50);
        assert_eq!(a.format, Format::Text);
        assert!(!a.keep && !a.allow_remote && !a.strict && a.only.is_empty());
        let target = target_of(&a).unwrap();
        assert_eq!(target.shape, Shape::default());
        assert_eq!(target.base_path(), "/v1/orders");
    }

    #[test]
    fn the_seed_profile_is_the_seed_s_shape_and_a_flag_overrides_one_member() {
        let seed = target_of(&args(&["--profile", "seed"])).unwrap();
        assert_eq!(seed.base_path(), "/orders");
        assert_eq!(seed.shape.list_query, "");
        let renamed = target_of(&args(&[
            "--profile",
            "seed",
            "--quantity-field",
            "qty",
            "--base-path",
            "/api/orders/",
        ]))
        .unwrap();
        assert_eq!(renamed.shape.quantity_field, "qty");
        assert_eq!(renamed.base_path(), "/api/orders");
        assert_eq!(renamed.shape.item_field, "item");
        assert!(target_of(&args(&["--base-path", "orders"])).is_err());
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
    fn a_target_that_cannot_be_reached_judges_nothing_and_the_run_fails() {
        let target = Target::new("http://127.0.0.1:1");
        let report = run_attacks(&target, &ATTACKS.iter().collect::<Vec<_>>(), false);
        let tenancy = ATTACKS
            .iter()
            .filter(|a| a.needs == Needs::TwoUsers)
            .count();
        assert_eq!(report.not_run, ATTACKS.len() - tenancy);
        assert_eq!(report.skipped, tenancy);
        assert_eq!(
            report.summary(),
            format!(
                "0 blocked, 0 exposed, {} not run, {tenancy} skipped, 0 deviations",
                ATTACKS.len() - tenancy
            )
        );
        for check in &report.checks {
            match &check.verdict {
                Verdict::NotRun { reason } => {
                    assert!(reason.starts_with("the control"), "{reason}");
                    assert_eq!(check.control.len(), 1, "{check:?}");
                }
                Verdict::Skipped { reason } => assert!(reason.contains("--token-b"), "{reason}"),
                other => panic!("{}: {other:?}", check.id),
            }
        }
        let refused = report.outcome().unwrap_err().to_string();
        assert!(refused.starts_with("no check could run"), "{refused}");
    }
}
