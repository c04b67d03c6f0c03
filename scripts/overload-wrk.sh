#!/usr/bin/env bash
# The overload case with `wrk` as the load (docs/PERFORMANCE.md, "Where the
# overload tail comes from"): 640 connections (10 × WRITE_ADMISSION) of
# creates, each with a key of its own, against the release server with its
# default settings on a fresh SQLite file. First closed (every connection
# sends again as soon as it is answered), then paced (each connection waits
# DELAY ms before each request, so the offered rate is at most 640 / DELAY
# per second whatever the latency). Prints, per run: requests per second,
# answers by status, wrk's latency percentiles over every answer, and the
# mean Little's law gives a closed loop (connections ÷ throughput).
#
#   scripts/overload-wrk.sh                 # 10 s per run
#   BENCH_SECONDS=5 DELAYS="100 40" scripts/overload-wrk.sh
#
# wrk reports one distribution for every answer: it cannot split shed (503)
# from admitted (201) answers. So a probe runs beside it: one `curl` at a
# time, each a create with a key of its own on a connection of its own,
# whose `time_total` (connect to last byte, measured inside curl) is
# reported by status. `examples/overload.rs` splits them too, with its own
# 640 client threads, and checks every key against the database.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/serve.sh

command -v wrk >/dev/null || {
  echo "overload-wrk: please install wrk (apt-get install wrk)" >&2
  exit 1
}
seconds=${BENCH_SECONDS:-10}
delays=${DELAYS:-200 100 60 40}
connections=640

cargo build --release --locked --quiet --bin orders-api
target_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
binary=$target_dir/release/orders-api

work=$(mktemp -d /tmp/orders-api-overload.XXXXXX)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

export DATABASE_URL=sqlite://$work/orders.db
"$binary" migrate
token=$("$binary" keys create overload)
serve_on_free_port "$binary" "$work/server.log"

cat >"$work/create.lua" <<'LUA'
local token, body = os.getenv("TOKEN"), '{"item":"Widget","quantity":2,"price":9.99}'
local delay_ms = tonumber(os.getenv("DELAY_MS") or "0")
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_id", #threads)
end
function init(args)
  counter, statuses, run = 0, {}, args[1]
end
function request()
  counter = counter + 1
  return wrk.format("POST", "/v1/orders", {
    ["Authorization"] = "Bearer " .. token,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = run .. "-" .. thread_id .. "-" .. counter,
  }, body)
end
if delay_ms > 0 then
  function delay() return delay_ms end
end
function response(status)
  statuses[status] = (statuses[status] or 0) + 1
end
function done(summary, latency)
  local by_status = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      by_status[status] = (by_status[status] or 0) + n
    end
  end
  local seconds = summary.duration / 1e6
  local answers = ""
  for _, status in ipairs({201, 503}) do
    answers = answers .. string.format("%d: %d, ", status, by_status[status] or 0)
    by_status[status] = nil
  end
  local other = 0
  for _, n in pairs(by_status) do other = other + n end
  io.write(string.format(
    "| %s | %.0f | %sother: %d, errors: %d | %.2f / %.2f / %.2f / %.2f ms | %.2f ms |\n",
    os.getenv("MODE"), summary.requests / seconds, answers, other,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000, latency.mean / 1000,
    tonumber(os.getenv("CONNECTIONS")) / (summary.requests / seconds) * 1000))
end
LUA

echo "wrk against $address: $connections connections, $seconds s per run, SQLite, default settings"
echo
echo "| load | requests/s | answers | p50 / p99 / p99.9 / mean | connections ÷ requests/s | probe: 201 n, p50 / p90 / max | probe: 503 n, p50 / p90 / max |"
echo "|---|---:|---|---:|---:|---:|---:|"
# Sequential creates until the file $1 exists; one "STATUS SECONDS" line each.
probe() {
  local n=0
  while [ ! -e "$1" ]; do
    n=$((n + 1))
    curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -X POST "$address/v1/orders" \
      -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
      -H "Idempotency-Key: probe-$2-$n" -d '{"item":"Widget","quantity":2,"price":9.99}' || true
    sleep 0.02
  done
}
summary() {
  python3 -c '
import sys
by = {}
for line in open(sys.argv[1]):
    status, seconds = line.split()
    by.setdefault(status, []).append(float(seconds) * 1000)
cells = []
for status in ("201", "503"):
    t = sorted(by.get(status, []))
    q = lambda p: t[min(len(t) - 1, int(p * len(t)))]
    cells.append(f"{len(t)}, {q(.5):.2f} / {q(.9):.2f} / {t[-1]:.2f} ms" if t else "0")
print(" | ".join(cells) + " |")
' "$1"
}
run() {
  rm -f "$work/stop"
  probe "$work/stop" "$2" >"$work/probe" &
  local prober=$!
  local row
  row=$(CONNECTIONS=$connections MODE=$1 DELAY_MS=$2 TOKEN=$token wrk -t2 -c"$connections" -d"${seconds}s" \
    --timeout 10s -s "$work/create.lua" "$address" -- "run$2" | grep '^| ')
  touch "$work/stop"
  wait "$prober"
  echo "$row $(summary "$work/probe")"
}
run closed 0
for delay in $delays; do
  run "paced, ${delay} ms between requests" "$delay"
done
