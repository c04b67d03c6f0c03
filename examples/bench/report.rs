//! The report: one line per case, the ratios, and the server's peak RSS.

use std::fmt::Write as _;

use super::wrk::WrkResult;
use super::{Config, Target};

#[derive(Default)]
pub(crate) struct Report {
    pub(crate) durability: String,
    /// Creates answered against orders stored, per create case.
    pub(crate) checks: Vec<String>,
    pub(crate) rows: Vec<(String, WrkResult)>,
    pub(crate) peak_rss_kb: Option<u64>,
    pub(crate) purge_left: Option<i64>,
    pub(crate) pgbench: Option<f64>,
    /// `/proc/loadavg`'s one-minute figure when the run started.
    pub(crate) load_at_start: Option<String>,
}

/// The one-minute load average now (Linux), as `uptime` shows it.
pub(crate) fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next().map(str::to_owned)
}

impl Report {
    pub(crate) fn add(&mut self, name: &str, result: WrkResult) {
        eprintln!(
            "  {name}: {:.0} req/s, p99 {:.1} ms, {} errors",
            result.requests_per_sec, result.p99_ms, result.errors
        );
        self.rows.push((name.to_owned(), result));
    }

    /// Every answered create must have made exactly one order (wrk drops
    /// the requests still in flight when it stops, which may still commit:
    /// up to one per connection per wrk run).
    pub(crate) fn check_creates(&mut self, name: &str, stored: i64) {
        let answered = self.get(name).requests as i64;
        let in_flight = 2 * 32_i64;
        let verdict = if stored >= answered && stored - answered <= in_flight {
            "every answered create made one order"
        } else {
            "MISMATCH: a create was lost or two shared a key"
        };
        self.checks.push(format!(
            "  {name}: {answered} answered, {stored} orders stored: {verdict}"
        ));
    }

    pub(crate) fn get(&self, name: &str) -> WrkResult {
        self.rows
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }

    pub(crate) fn print(&self, config: &Config, target: &Target) {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nbackend: {:?}; {} connections; {} s per case; {} server process(es)\n",
            target.backend(),
            config.connections,
            config.seconds,
            config.processes
        );
        let _ = writeln!(out, "durability: {}", self.durability);
        let _ = writeln!(
            out,
            "load average at the start: {}\n",
            self.load_at_start.as_deref().unwrap_or("unknown")
        );
        let _ = writeln!(out, "| case | req/s | p50 ms | p99 ms | errors |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (name, r) in &self.rows {
            let _ = writeln!(
                out,
                "| {name} | {:.0} | {:.2} | {:.2} | {} |",
                r.requests_per_sec, r.p50_ms, r.p99_ms, r.errors
            );
        }
        if let Some(tps) = self.pgbench {
            let _ = writeln!(out, "| pgbench one-row insert | {tps:.0} | | | |");
        }
        let _ = writeln!(out, "\ncreates (warm-up included):");
        for check in &self.checks {
            let _ = writeln!(out, "{check}");
        }
        let create = self.get("POST /v1/orders create");
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let _ = writeln!(out, "\nratios (target in brackets):");
        let _ = writeln!(
            out,
            "  create / bare insert          {:.2}  (one transaction per request)",
            ratio(
                create.requests_per_sec,
                self.get("bare insert (baseline)").requests_per_sec
            )
        );
        let group = self.get("bare insert, group commit FULL (baseline)");
        if group.requests_per_sec > 0.0 {
            let _ = writeln!(
                out,
                "  create / group-commit insert  {:.2}  [>= 0.9 on SQLite]",
                ratio(create.requests_per_sec, group.requests_per_sec)
            );
        }
        let _ = writeln!(
            out,
            "  create p99                    {:.1} ms  [<= 25 ms]",
            create.p99_ms
        );
        let bare_read = self.get("bare read (baseline)").requests_per_sec;
        let _ = writeln!(
            out,
            "  replay / bare read            {:.2}  [>= 0.8]",
            ratio(
                self.get("POST /v1/orders replay").requests_per_sec,
                bare_read
            )
        );
        let get = self.get("GET /v1/orders/{id}").requests_per_sec;
        let _ = writeln!(
            out,
            "  GET order / bare read         {:.2}  [>= 0.8]",
            ratio(get, bare_read)
        );
        let _ = writeln!(
            out,
            "  replay / GET of the order     {:.2}  [>= 0.95 on SQLite, >= 0.9 on PostgreSQL]",
            ratio(self.get("POST /v1/orders replay").requests_per_sec, get)
        );
        let purging = self.get("create while purging 1M expired");
        let _ = writeln!(
            out,
            "  create p99 purging / not      {:.2}  [<= 2.0] ({} backlog rows left after the run)",
            ratio(purging.p99_ms, create.p99_ms),
            self.purge_left.unwrap_or(-1)
        );
        if let Some(kb) = self.peak_rss_kb {
            let _ = writeln!(
                out,
                "  peak RSS of the server        {:.1} MB  [<= 64 MB]",
                kb as f64 / 1024.0
            );
        }
        if let Some(tps) = self.pgbench {
            let _ = writeln!(
                out,
                "  create / pgbench insert       {:.2}  [>= 0.6 on PostgreSQL]",
                ratio(create.requests_per_sec, tps)
            );
        }
        println!("{out}");
    }
}
