//! `orders-api atk chaos --server URL …`: concurrent clients that create,
//! update, cancel and read orders, each change under a key of its own, and
//! retry as generated SDKs do, through this command's own fault-injecting
//! proxy on 127.0.0.1 ([`proxy`]), while a command restarts the server now
//! and then (`--restart-cmd`, e.g. a `kill -9` and a start); then every
//! user's orders are listed straight from the server, and the history of
//! the run is checked ([`crate::history`]) and reported.
//!
//! Everything is bounded: the clients start operations for `--duration`
//! seconds, each operation retries at most [`MAX_ATTEMPTS`] times
//! within [`OP_BUDGET`], a restart command may run for
//! [`RESTART_TIMEOUT`], and only a server on this machine is driven.

mod client;
pub mod proxy;
mod rng;

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use client::{MAX_ATTEMPTS, OP_BUDGET, PAGE_ATTEMPTS, REQUEST_TIMEOUT};
pub use proxy::{FaultCounts, FaultProxy};

use crate::history::{self, Checked, Outcome, report};
use crate::{AtkError, DEFAULT_SERVER, Format};

/// How long one run of the restart command may take before it is killed.
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(60);
/// Clients at most.
pub const MAX_CLIENTS: u32 = 64;
/// `--duration` at most, in seconds.
pub const MAX_DURATION_SECS: u64 = 3600;

/// `orders-api atk chaos`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// The server to drive (this machine only: it is restarted and written to).
    #[arg(long, default_value = DEFAULT_SERVER)]
    pub server: String,
    /// User A's bearer token; without one, requests carry no Authorization.
    #[arg(long, env = "ORDERS_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A second user's bearer token: half the clients act as user B.
    #[arg(long = "token-b", env = "ORDERS_API_TOKEN_B", hide_env_values = true)]
    pub token_b: Option<String>,
    /// How long the clients start new operations, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=MAX_DURATION_SECS))]
    pub duration: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CLIENTS)))]
    pub clients: u32,
    /// A shell command (`sh -c`) that restarts the server, e.g. a kill -9 and a start.
    #[arg(long = "restart-cmd", value_name = "CMD", requires = "restart_every")]
    pub restart_cmd: Option<String>,
    /// Run --restart-cmd every SECS seconds while the clients run.
    #[arg(long = "restart-every", value_name = "SECS", requires = "restart_cmd",
          value_parser = clap::value_parser!(u64).range(1..=MAX_DURATION_SECS))]
    pub restart_every: Option<u64>,
    /// Write the history (JSON Lines) to FILE as it is recorded.
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// The seed of the clients' choices and the proxy's faults [default: a fresh one, reported].
    #[arg(long)]
    pub seed: Option<u64>,
    /// The report's format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the report to FILE (the text report then goes to stdout).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// What restarts the server while the clients run.
pub enum Restart {
    /// `sh -c CMD`, killed after [`RESTART_TIMEOUT`].
    Command(String),
    /// A function of the caller's (a test's own server process).
    Hook(Box<dyn FnMut() -> Result<(), String> + Send>),
}

/// One chaos run, as the flags describe it.
pub struct ChaosConfig {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub server: String,
    pub tokens: Vec<Option<String>>,
    pub duration: Duration,
    pub clients: usize,
    pub restart: Option<(Restart, Duration)>,
    pub history: Option<PathBuf>,
    pub seed: u64,
}

impl ChaosConfig {
    /// A run against `server` (this machine's) as one user with `token`:
    /// 4 clients for 5 seconds, no restarts, a fresh seed.
    pub fn new(server: &str, token: Option<&str>) -> Self {
        Self {
            server: server.trim_end_matches('/').to_owned(),
            tokens: vec![token.map(str::to_owned)],
            duration: Duration::from_secs(5),
            clients: 4,
            restart: None,
            history: None,
            seed: fresh_seed(),
        }
    }
}

fn fresh_seed() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return client::now_nanos();
    }
    u64::from_le_bytes(bytes)
}

/// One run of the restart command.
#[derive(Debug, Clone, Serialize)]
pub struct RestartRun {
    /// When it started, from the start of the run.
    pub after_millis: u128,
    pub ok: bool,
    /// Its exit status, or why it failed.
    pub outcome: String,
}

/// Attempts of one kind of operation, by how they ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    pub attempts: usize,
    pub ok: usize,
    pub fail: usize,
    pub info: usize,
}

/// A chaos run: what it did, and what the check of its history found.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    pub server: String,
    pub proxy: String,
    pub run_id: String,
    pub seed: u64,
    pub clients: usize,
    pub users: Vec<String>,
    pub duration_secs: u64,
    /// Attempts by operation (`create`, `update`, …).
    pub operations: BTreeMap<&'static str, Counts>,
    /// Creates, updates and cancels answered ok.
    pub acknowledged: usize,
    pub faults: FaultCounts,
    pub restarts: Vec<RestartRun>,
    pub history_file: Option<String>,
    pub check: Checked,
    /// Why the run could not be judged (a closing list that never came, a
    /// history that could not be checked), if it could not.
    pub problems: Vec<String>,
    pub millis: u128,
    /// The history, one event a line.
    #[serde(skip)]
    pub lines: Vec<String>,
}

impl ChaosReport {
    /// The report in `format`, as the command writes it.
    pub fn render(&self, format: Format) -> String {
        render(self, format)
    }

    /// `Ok` only when the run could be judged, its history is consistent,
    /// and something was acknowledged.
    pub fn outcome(&self) -> Result<(), AtkError> {
        if !self.check.consistent() {
            return Err(history::inconsistent(&self.check));
        }
        if let Some(problem) = self.problems.first() {
            return Err(AtkError::CannotJudge(problem.clone()));
        }
        if self.acknowledged == 0 {
            let answered = self
                .operations
                .values()
                .map(|c| c.fail + c.ok)
                .sum::<usize>();
            return Err(AtkError::NothingAcknowledged {
                reason: format!(
                    "no create, update or cancel was answered 2xx ({answered} attempts were \
                     answered at all); is the token valid, is {} this API?",
                    self.server
                ),
            });
        }
        Ok(())
    }
}

/// `orders-api atk chaos`: checks the flags, runs, reports.
pub fn run(args: &ChaosArgs) -> Result<(), AtkError> {
    let config = config_of(args)?;
    let report = run_chaos(config)?;
    crate::output::emit(
        &report.render(Format::Text),
        &|format| report.render(format),
        args.format,
        args.out.as_deref(),
    )?;
    report.outcome()
}

fn config_of(args: &ChaosArgs) -> Result<ChaosConfig, AtkError> {
    let token = |t: &Option<String>| t.clone().filter(|t| !t.trim().is_empty());
    let mut tokens = vec![token(&args.token)];
    if let Some(b) = token(&args.token_b) {
        tokens.push(Some(b));
    }
    let restart = match (&args.restart_cmd, args.restart_every) {
        (Some(cmd), Some(every)) if !cmd.trim().is_empty() => {
            Some((Restart::Command(cmd.clone()), Duration::from_secs(every)))
        }
        (None, None) => None,
        _ => {
            return Err(AtkError::Usage(
                "--restart-cmd and --restart-every go together".into(),
            ));
        }
    };
    Ok(ChaosConfig {
        server: args.server.trim().trim_end_matches('/').to_owned(),
        tokens,
        duration: Duration::from_secs(args.duration),
        clients: args.clients as usize,
        restart,
        history: args.history.clone(),
        seed: args.seed.unwrap_or_else(fresh_seed),
    })
}

/// The address of `server`, which must be `http://` on this machine.
fn loopback_address(server: &str) -> Result<SocketAddr, AtkError> {
    let uri: ureq::http::Uri = server
        .parse()
        .map_err(|e| AtkError::Usage(format!("--server {server}: not a URL ({e})")))?;
    if uri.scheme_str() != Some("http") {
        return Err(AtkError::Usage(format!(
            "--server {server}: expected http://127.0.0.1:PORT"
        )));
    }
    let host = uri
        .host()
        .ok_or_else(|| AtkError::Usage(format!("--server {server}: no host")))?;
    if !crate::is_loopback(host) {
        return Err(AtkError::Usage(format!(
            "--server {server} is not on this machine: chaos drives only a server on 127.0.0.1 \
             (it restarts and writes to it)"
        )));
    }
    let port = uri.port_u16().unwrap_or(80);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.find(|a| a.ip().is_loopback()))
        .ok_or_else(|| AtkError::Usage(format!("--server {server}: no loopback address")))
}

/// Lists every user's orders, runs the clients through the proxy for
/// `config.duration` (restarting the server as asked), lists them again,
/// checks the history. `Err` only when the run could not start: the server
/// cannot be reached, or its orders cannot be listed.
pub fn run_chaos(config: ChaosConfig) -> Result<ChaosReport, AtkError> {
    let started = Instant::now();
    let upstream = loopback_address(&config.server)?;
    let file = match &config.history {
        Some(path) => Some(File::create(path).map_err(|source| AtkError::Write {
            path: path.display().to_string(),
            source,
        })?),
        None => None,
    };
    let agent = crate::wire::agent(REQUEST_TIMEOUT, "orders-atk-chaos");
    crate::wire::exchange::<&str, &str>(
        &agent,
        "GET",
        &format!("{}/v1/orders", config.server),
        &[],
        None,
    )
    .map_err(|e| AtkError::Unreachable {
        server: config.server.clone(),
        reason: e.to_string(),
    })?;

    let run_id = crate::probe::Target::new(&config.server).run_id;
    let users: Vec<client::UserSide> = config
        .tokens
        .iter()
        .zip(["user-a", "user-b"])
        .map(|(token, label)| client::UserSide {
            label: label.into(),
            token: token.clone(),
            orders: std::sync::Mutex::new(Vec::new()),
        })
        .collect();
    let recorder = client::Recorder::new(file);
    let mut problems: Vec<String> = Vec::new();
    // The opening lists: what the users had before (not this run's). Without
    // them no order could be told from this run's: nothing starts.
    for user in &users {
        client::list_all(&recorder, &config.server, user, PAGE_ATTEMPTS)
            .map_err(AtkError::CannotJudge)?;
    }

    let mut proxy = FaultProxy::start(upstream, config.seed).map_err(|source| AtkError::Write {
        path: "the proxy's port on 127.0.0.1".into(),
        source,
    })?;
    let until = Instant::now() + config.duration;
    let shared = client::Shared {
        recorder: &recorder,
        base: proxy.url(),
        run_id: run_id.clone(),
        users: &users,
        seed: config.seed,
        until,
        op_budget: OP_BUDGET,
    };
    let (stop_restarts, stopped) = mpsc::channel::<()>();
    let restarts = std::thread::scope(|scope| {
        let restarter = config.restart.map(|(restart, every)| {
            scope.spawn(move || restarts(restart, every, until, &stopped, started))
        });
        let clients: Vec<_> = (0..config.clients)
            .map(|n| {
                let shared = &shared;
                scope.spawn(move || client::client(shared, n))
            })
            .collect();
        for client in clients {
            let _ = client.join();
        }
        let _ = stop_restarts.send(());
        restarter.and_then(|r| r.join().ok()).unwrap_or_default()
    });
    // Every request still in the proxy ends before the closing lists.
    proxy.calm();
    let faults = proxy.stop();
    for user in &users {
        if let Err(e) = client::list_all(&recorder, &config.server, user, PAGE_ATTEMPTS) {
            problems.push(e);
        }
    }
    let (lines, write_error) = recorder.finish();
    if let (Some(e), Some(path)) = (write_error, &config.history) {
        problems.push(format!("writing the history to {}: {e}", path.display()));
    }

    let numbered = lines.iter().enumerate().map(|(i, l)| (i + 1, l.as_str()));
    let (operations, check) = match history::parse_lines(numbered) {
        Ok(parsed) => {
            let operations = counts(&parsed);
            match history::check(&parsed) {
                Ok(checked) => (operations, checked),
                Err(m) => {
                    problems.push(format!("its history cannot be checked: {m}"));
                    (operations, Checked::default())
                }
            }
        }
        Err(m) => {
            problems.push(format!("its history cannot be read back: {m}"));
            (BTreeMap::new(), Checked::default())
        }
    };
    Ok(ChaosReport {
        server: config.server,
        proxy: proxy.url(),
        run_id,
        seed: config.seed,
        clients: config.clients,
        users: users.iter().map(|u| u.label.clone()).collect(),
        duration_secs: config.duration.as_secs(),
        acknowledged: check.acknowledged,
        operations,
        faults,
        restarts,
        history_file: config.history.as_ref().map(|p| p.display().to_string()),
        check,
        problems,
        millis: started.elapsed().as_millis(),
        lines,
    })
}

/// Attempts per operation, by outcome.
fn counts(parsed: &history::History) -> BTreeMap<&'static str, Counts> {
    let mut counts: BTreeMap<&'static str, Counts> = BTreeMap::new();
    for op in &parsed.operations {
        let c = counts.entry(op.f.name()).or_default();
        c.attempts += 1;
        match op.outcome {
            Outcome::Ok { .. } => c.ok += 1,
            Outcome::Fail { .. } => c.fail += 1,
            Outcome::Info { .. } => c.info += 1,
        }
    }
    counts
}

/// Runs `restart` every `every` until `until` or a word on `stop`.
fn restarts(
    mut restart: Restart,
    every: Duration,
    until: Instant,
    stop: &mpsc::Receiver<()>,
    started: Instant,
) -> Vec<RestartRun> {
    let mut runs = Vec::new();
    loop {
        match stop.recv_timeout(every) {
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < until => {}
            _ => return runs,
        }
        let after_millis = started.elapsed().as_millis();
        let result = match &mut restart {
            Restart::Command(command) => run_command(command, RESTART_TIMEOUT),
            Restart::Hook(hook) => hook().map(|()| "done".to_owned()),
        };
        runs.push(match result {
            Ok(outcome) => RestartRun {
                after_millis,
                ok: true,
                outcome,
            },
            Err(outcome) => RestartRun {
                after_millis,
                ok: false,
                outcome,
            },
        });
    }
}

/// `sh -c command`, its output discarded, killed after `timeout`
/// ([`RESTART_TIMEOUT`]).
fn run_command(command: &str, timeout: Duration) -> Result<String, String> {
    let mut child = Command::new("sh")
        .args(["-c", command])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run sh -c: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(status.to_string()),
            Ok(Some(status)) => return Err(status.to_string()),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {timeout:?}: killed"));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// A port of 127.0.0.1 nobody listens on right now.
/// `orders-api atk chaos`'s text report.
fn text(report: &ChaosReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "orders-api atk chaos against {} through {} (run {}, seed {}, {} clients as {}, {} s)\n",
        report.server,
        report.proxy,
        report.run_id,
        report.seed,
        report.clients,
        report.users.join(" and "),
        report.duration_secs
    );
    for (f, c) in &report.operations {
        let _ = writeln!(
            out,
            "{f:>6}: {} attempts, {} ok, {} fail, {} info",
            c.attempts, c.ok, c.fail, c.info
        );
    }
    let f = &report.faults;
    let _ = writeln!(
        out,
        "proxy: {} requests, {} passed, {} delayed, {} dropped before the server, {} answers dropped, \
         {} resets, {} answered 502 (no answer from the server)",
        f.requests,
        f.passed,
        f.delayed,
        f.dropped_requests,
        f.dropped_answers,
        f.resets,
        f.server_unreachable
    );
    if !report.restarts.is_empty() {
        let failed = report.restarts.iter().filter(|r| !r.ok).count();
        let _ = writeln!(
            out,
            "restarts: {} ({failed} failed{})",
            report.restarts.len(),
            report
                .restarts
                .iter()
                .find(|r| !r.ok)
                .map(|r| format!(": {}", r.outcome))
                .unwrap_or_default()
        );
    }
    if let Some(file) = &report.history_file {
        let _ = writeln!(out, "history: {file} ({} events)", report.lines.len());
    }
    out.push('\n');
    for problem in &report.problems {
        let _ = writeln!(out, "cannot judge: {problem}");
    }
    report::rules_text(&report.check, &mut out);
    let _ = writeln!(out, "\n{}", report::checked_summary(&report.check));
    out
}

/// `orders-api atk chaos`'s report in `format`.
fn render(report: &ChaosReport, format: Format) -> String {
    match format {
        Format::Text => text(report),
        Format::Json => crate::output::json(report),
        Format::Junit => {
            let acknowledged = if report.acknowledged > 0 {
                None
            } else {
                Some("no create, update or cancel was answered 2xx".to_owned())
            };
            let mut extra: Vec<(&str, Option<String>)> =
                vec![("something acknowledged", acknowledged)];
            for problem in &report.problems {
                extra.push(("the run could be judged", Some(problem.clone())));
            }
            report::rules_junit(
                "orders-api atk chaos",
                &report.check,
                report.millis,
                &[
                    ("server", report.server.clone()),
                    ("run_id", report.run_id.clone()),
                    ("seed", report.seed.to_string()),
                    ("acknowledged", report.acknowledged.to_string()),
                    ("restarts", report.restarts.len().to_string()),
                ],
                &extra,
            )
        }
    }
}

#[cfg(test)]
pub(crate) fn tests_free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_command_is_killed_when_it_outlives_its_time_and_its_failure_is_reported() {
        assert_eq!(
            run_command("true", RESTART_TIMEOUT),
            Ok("exit status: 0".into())
        );
        let failed = run_command("exit 3", RESTART_TIMEOUT).unwrap_err();
        assert!(failed.contains('3'), "{failed}");
        let started = Instant::now();
        let killed = run_command("sleep 30", Duration::from_millis(100)).unwrap_err();
        assert!(killed.ends_with("killed"), "{killed}");
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    fn parse(flags: &[&str]) -> Result<ChaosArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            chaos: ChaosArgs,
        }
        <Cli as clap::Parser>::try_parse_from(std::iter::once("chaos").chain(flags.iter().copied()))
            .map(|c| c.chaos)
    }

    #[test]
    fn clients_duration_and_restarts_are_bounded_and_restarts_need_both_flags() {
        let defaults = parse(&[]).unwrap();
        assert_eq!((defaults.clients, defaults.duration), (8, 30));
        for refused in [
            &["--clients", "0"][..],
            &["--clients", "65"],
            &["--duration", "0"],
            &["--duration", "3601"],
            &["--restart-cmd", "true"],
            &["--restart-every", "5"],
            &["--restart-cmd", "true", "--restart-every", "0"],
        ] {
            assert!(parse(refused).is_err(), "{refused:?}");
        }
        assert!(
            parse(&[
                "--clients",
                "64",
                "--duration",
                "3600",
                "--restart-cmd",
                "true",
                "--restart-every",
                "5"
            ])
            .is_ok()
        );
    }

    #[test]
    fn only_a_server_on_this_machine_is_driven() {
        for server in [
            "http://10.0.0.5:8080",
            "http://example.com",
            "https://127.0.0.1:1",
        ] {
            assert!(loopback_address(server).is_err(), "{server}");
        }
        for server in [
            "http://127.0.0.1:8080",
            "http://localhost:9",
            "http://[::1]:80",
        ] {
            let address = loopback_address(server).unwrap();
            assert!(address.ip().is_loopback(), "{server}");
        }
    }
}
