//! Load: the `wrk` Lua scripts, the driver that runs one `wrk` per server
//! and sums their results, and the parser of `wrk`'s output.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{BODY, Config, env_or};

pub(crate) struct Scripts {
    pub(crate) healthz: PathBuf,
    pub(crate) bare_insert: PathBuf,
    pub(crate) bare_group_insert: PathBuf,
    pub(crate) bare_read: PathBuf,
    pub(crate) create: PathBuf,
    pub(crate) replay: PathBuf,
    pub(crate) get: PathBuf,
    pub(crate) mixed: PathBuf,
}

impl Scripts {
    /// wrk scripts; every thread numbers its own keys, so keys never repeat.
    ///
    /// A ratio compares the service with its ceiling, so both sides get the
    /// same request, made by the same Lua: the bare inserts are sent the
    /// create's (its headers, a fresh key, its body), the bare read the
    /// `GET`'s (with the token). A request that never changes (the read,
    /// the replay, `/healthz`) is built once per thread and then sent as
    /// is: building it per request cost `wrk` a quarter of a read's
    /// throughput on these two cores (29,400 against 38,300 `GET`s per
    /// second from the same server), and the generator's cost would weigh
    /// on one side of a ratio only.
    pub(crate) fn write(dir: &Path, token: &str) -> Self {
        let body = BODY.replace('"', "\\\"");
        let common = format!(
            r#"local token = "{token}"
local body = "{body}"
local counter = 0
local threads = 0
-- args: an id unique to this wrk invocation, then the replayed key and the
-- read path. `thread_id` is a global that setup() gives each thread's own
-- state (a `local` of that name would hide it, and every thread would send
-- the same keys).
local invocation, key, path = "", nil, nil
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end
function init(args)
  invocation, key, path = args[1], args[2], args[3]
end
local function auth(h) h["Authorization"] = "Bearer " .. token return h end
local function create_at(p)
  counter = counter + 1
  return wrk.format("POST", p, auth({{["Content-Type"] = "application/json",
    ["Idempotency-Key"] = invocation .. "-" .. thread_id .. "-" .. counter}}), body)
end
local function create() return create_at("/v1/orders") end
-- A request that never changes, built on its first use and then sent as is.
local function once(build)
  local built = nil
  return function()
    if built == nil then built = build() end
    return built
  end
end
local function replay(k)
  return wrk.format("POST", "/v1/orders", auth({{["Content-Type"] = "application/json",
    ["Idempotency-Key"] = k}}), body)
end
local function read(p) return wrk.format("GET", p, auth({{}})) end
"#,
        );
        let file = |name: &str, body: &str| -> PathBuf {
            let path = dir.join(format!("{name}.lua"));
            std::fs::write(&path, format!("{common}{body}")).expect("write wrk script");
            path
        };
        Self {
            healthz: file(
                "healthz",
                "request = once(function() return wrk.format(\"GET\", \"/healthz\") end)\n",
            ),
            // Each ceiling gets the very request of the case measured
            // against it (the baseline ignores what it does not need).
            bare_insert: file(
                "bare_insert",
                "request = function() return create_at(\"/bare\") end\n",
            ),
            bare_group_insert: file(
                "bare_group_insert",
                "request = function() return create_at(\"/bare-group\") end\n",
            ),
            bare_read: file(
                "bare_read",
                "request = once(function() return read(\"/bare/1\") end)\n",
            ),
            create: file("create", "request = create\n"),
            replay: file(
                "replay",
                "request = once(function() return replay(key) end)\n",
            ),
            get: file("get", "request = once(function() return read(path) end)\n"),
            mixed: file(
                "mixed",
                "request = function()\n  local r = math.random(10)\n  if r <= 7 then return create()\n  \
                 elseif r <= 9 then return replay(key)\n  else return read(path) end\nend\n",
            ),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct WrkResult {
    /// Responses received (warm-up included, for the stored-orders check).
    pub(crate) requests: u64,
    pub(crate) requests_per_sec: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) errors: u64,
}

/// Runs wrk against every base at once (the connections split between
/// them) and adds up what they served: first a warm-up of
/// `BENCH_WARMUP_SECONDS` (2) whose figures are dropped (a new database's
/// WAL file grows to its working size, caches fill), then the measurement.
pub(crate) fn wrk_all(
    config: &Config,
    bases: &[String],
    script: &Path,
    args: &[&str],
) -> WrkResult {
    let warmup: u64 = env_or("BENCH_WARMUP_SECONDS", 2);
    let warm = if warmup > 0 {
        wrk_once(config, bases, script, args, warmup).requests
    } else {
        0
    };
    let mut measured = wrk_once(config, bases, script, args, config.seconds);
    measured.requests += warm;
    measured
}

/// A prefix no other wrk invocation of this run uses, for its keys.
pub(crate) fn invocation_id() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!(
        "{}-{}-{n}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

pub(crate) fn wrk_once(
    config: &Config,
    bases: &[String],
    script: &Path,
    args: &[&str],
    seconds: u64,
) -> WrkResult {
    let connections = (config.connections as usize / bases.len()).max(1);
    let threads = connections.min(2);
    let children: Vec<Child> = bases
        .iter()
        .map(|base| {
            Command::new("wrk")
                .args([
                    "--latency",
                    "-t",
                    &threads.to_string(),
                    "-c",
                    &connections.to_string(),
                    "-d",
                    &format!("{seconds}s"),
                    "-s",
                ])
                .arg(script)
                .arg(base)
                .arg("--")
                .arg(invocation_id())
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("wrk (apt-get install wrk)")
        })
        .collect();
    let mut total = WrkResult::default();
    for child in children {
        let output = child.wait_with_output().expect("wrk");
        let one = parse_wrk(&String::from_utf8_lossy(&output.stdout));
        total.requests += one.requests;
        total.requests_per_sec += one.requests_per_sec;
        total.p50_ms = total.p50_ms.max(one.p50_ms);
        total.p99_ms = total.p99_ms.max(one.p99_ms);
        total.errors += one.errors;
    }
    total
}

pub(crate) fn parse_wrk(out: &str) -> WrkResult {
    let mut result = WrkResult::default();
    for line in out.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Requests/sec:"), Some(v)) => result.requests_per_sec = v.parse().unwrap_or(0.0),
            (Some(n), Some("requests")) => result.requests = n.parse().unwrap_or(0),
            (Some("50%"), Some(v)) => result.p50_ms = duration_ms(v),
            (Some("99%"), Some(v)) => result.p99_ms = duration_ms(v),
            (Some("Non-2xx"), _) => {
                result.errors += line
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            (Some("Socket"), Some("errors:")) => {
                result.errors += line
                    .split(',')
                    .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                    .sum::<u64>();
            }
            _ => {}
        }
    }
    result
}

/// wrk's `1.23ms`, `456.78us`, `1.20s`.
pub(crate) fn duration_ms(v: &str) -> f64 {
    let (number, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (v, 1.0)
    };
    number.parse::<f64>().unwrap_or(0.0) * scale
}
