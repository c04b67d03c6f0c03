#!/usr/bin/env bash
# Instructions per request (docs/PERFORMANCE.md, "How to measure"):
# the release server under callgrind on a fresh SQLite file, warmed up, its
# counters zeroed, then exactly N requests of one kind from a keep-alive
# client, dumped and divided by N. Instruction counts do not depend on what
# else the machine runs, so they compare builds where wall-clock figures
# cannot.
#
#   scripts/profile.sh                  # create, replay, get and the ceilings, 2000 each
#   REQUESTS=500 scripts/profile.sh create
#   ORDERS_API_BIN=/path/to/orders-api BENCH_BIN=/path/to/examples/bench scripts/profile.sh   # another build
#
# The ceilings are the benchmark's (`examples/bench/baseline.rs`), served by
# its binary alone (`BENCH_CEILINGS_ONLY`) and sent the service's requests:
# bare-group-insert is a create's (headers, a fresh key, the body) to the
# group-committing writer at FULL, bare-read a GET's (the token) to a
# primary-key read.
#
# Prints one line per kind: total instructions ÷ requests, the whole process
# (every thread: workers, blocking threads, the SQLite writer). Keeps each
# dump (callgrind.KIND.out in $PROFILE_DIR, default a temp dir that is
# printed) for `callgrind_annotate --inclusive=yes FILE | head -80`.
# The build carries line tables (CARGO_PROFILE_RELEASE_DEBUG), which change
# no code, so that the annotations name source lines.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v valgrind >/dev/null || {
  echo "profile: please install valgrind (apt-get install valgrind)" >&2
  exit 1
}
requests=${REQUESTS:-2000}
clients=${CLIENTS:-4}
kinds=${*:-create replay get bare-group-insert bare-read}

if [ -z "${ORDERS_API_BIN:-}" ] || [ -z "${BENCH_BIN:-}" ]; then
  export CARGO_PROFILE_RELEASE_DEBUG=${CARGO_PROFILE_RELEASE_DEBUG:-line-tables-only}
  cargo build --release --locked --quiet --bin orders-api --example bench
  target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  ORDERS_API_BIN=${ORDERS_API_BIN:-$target_dir/release/orders-api}
  BENCH_BIN=${BENCH_BIN:-$target_dir/release/examples/bench}
fi
out=${PROFILE_DIR:-$(mktemp -d /tmp/orders-api-profile.XXXXXX)}
mkdir -p "$out"
work=$(mktemp -d /tmp/orders-api-profile-db.XXXXXX)
server_pid=
stop_signal=INT
ceilings_dir=
stop() {
  if [ -n "$server_pid" ]; then
    kill "-$stop_signal" "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
  stop_signal=INT
  if [ -n "$ceilings_dir" ]; then
    rm -rf "$ceilings_dir"
    ceilings_dir=
  fi
}
trap 'stop; rm -rf "$work"' EXIT

# A keep-alive client: CLIENTS connections, REQUESTS in all, every answer
# checked. MODE create sends a fresh key each time; replay one key again
# and again; get reads one order.
client() {
  python3 - "$@" <<'PY'
import http.client, sys, threading, uuid
address, token, mode, count, clients, key, path = sys.argv[1:8]
count, clients = int(count), int(clients)
host, port = address.split("//")[1].split(":")
body = '{"item":"Widget","quantity":2,"price":9.99}'
failures = []
def run(n, prefix):
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    for i in range(n):
        headers = {"Authorization": "Bearer " + token}
        if mode == "get":
            conn.request("GET", path, headers=headers)
            want = 200
        elif mode == "bare-read":
            conn.request("GET", "/bare/1", headers=headers)
            want = 200
        elif mode == "bare-group-insert":
            headers["Content-Type"] = "application/json"
            headers["Idempotency-Key"] = f"{prefix}-{i}"
            conn.request("POST", "/bare-group", body=body, headers=headers)
            want = 201
        else:
            headers["Content-Type"] = "application/json"
            headers["Idempotency-Key"] = key if mode == "replay" else f"{prefix}-{i}"
            conn.request("POST", "/v1/orders", body=body, headers=headers)
            want = 200 if mode == "replay" else 201
        response = conn.getresponse()
        response.read()
        if response.status != want:
            failures.append(response.status)
share = [count // clients + (1 if c < count % clients else 0) for c in range(clients)]
threads = [threading.Thread(target=run, args=(n, uuid.uuid4().hex)) for n in share]
for t in threads: t.start()
for t in threads: t.join()
if failures:
    sys.exit(f"{len(failures)} unexpected answers, e.g. {failures[0]}")
PY
}

export DATABASE_URL=sqlite://$work/orders.db
export RUST_LOG=warn
"$ORDERS_API_BIN" migrate >/dev/null
token=$("$ORDERS_API_BIN" keys create profile)
# Starts "$@" serving on a free port; sets server_pid and address.
start() {
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$@" serve --bind "127.0.0.1:$port" >>"$work/server.log" 2>&1 &
  server_pid=$!
  address=http://127.0.0.1:$port
  for _ in $(seq 1 1200); do
    curl -sf -o /dev/null "$address/readyz" && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$work/server.log" >&2
  exit 1
}

# Starts "$@" (the benchmark's ceilings, `examples/bench`) serving the
# bare-storage baseline on its own; sets server_pid and address.
start_ceilings() {
  BENCH_CEILINGS_ONLY=1 ORDERS_API_BIN=$ORDERS_API_BIN "$@" >"$work/ceilings.out" 2>>"$work/server.log" &
  server_pid=$!
  # It has no handler of its own, and a background job ignores SIGINT.
  stop_signal=TERM
  ceilings_dir=${TMPDIR:-/tmp}/orders-bench-$server_pid
  for _ in $(seq 1 1200); do
    address=$(head -n1 "$work/ceilings.out" 2>/dev/null || true)
    if [ -n "$address" ] && curl -s -o /dev/null "$address/bare/1"; then
      return 0
    fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$work/server.log" >&2
  exit 1
}

# The order that replays and reads use, made before any profile.
start "$ORDERS_API_BIN"
key=profile-replayed
location=$(curl -s -D - -o /dev/null -X POST "$address/v1/orders" -H "Authorization: Bearer $token" \
  -H 'Content-Type: application/json' -H "Idempotency-Key: $key" \
  -d '{"item":"Widget","quantity":2,"price":9.99}' | tr -d '\r' | sed -n 's/^[Ll]ocation: //p')
stop

echo "instructions per request, release build, SQLite, $requests requests over $clients keep-alive connections"
for kind in $kinds; do
  rm -f "$out/callgrind.$kind.out"*
  case $kind in
    bare-*) start_ceilings valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$kind.out" "$BENCH_BIN" ;;
    *) start valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$kind.out" "$ORDERS_API_BIN" ;;
  esac
  # Warm-up: connections, caches, prepared statements, the WAL's size.
  client "$address" "$token" "$kind" 200 "$clients" "$key" "$location"
  callgrind_control -z "$server_pid" >/dev/null 2>&1
  client "$address" "$token" "$kind" "$requests" "$clients" "$key" "$location"
  callgrind_control -d "$kind" "$server_pid" >/dev/null 2>&1
  stop
  # The dump taken on request (".1") holds the measured requests; the one
  # written at exit, only the shutdown.
  dump=$out/callgrind.$kind.out.1
  total=$(sed -n 's/^summary: //p; s/^totals: //p' "$dump" | head -n1 | awk '{print $1}')
  # glibc's memset clears actix-http's 3 KB header index with `rep stosb`
  # each time it tries to parse a head, which callgrind counts byte by byte
  # (one "instruction" per byte, about a hundred cycles on the CPU): shown
  # apart, because how often it runs depends on how the bytes arrived.
  memset=$(callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
    awk '/__memset_avx2_unaligned_erms/ && !seen { gsub(",", "", $1); print $1; seen = 1 }')
  awk -v t="$total" -v m="${memset:-0}" -v n="$requests" -v k="$kind" -v f="$dump" \
    'BEGIN { printf "  %-7s %8.0f per request, %8.0f without memset  (%s)\n", k, t / n, (t - m) / n, f }'
done
