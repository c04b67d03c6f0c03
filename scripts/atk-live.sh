#!/usr/bin/env bash
# The attack suite as a user runs it: `orders-api atk` against a live
# `orders-api serve`, on SQLite and on PostgreSQL, with two users' tokens and
# --strict (every attack BLOCKED, no deviation from the contract), and once
# without a token (nothing can be judged: it must exit non-zero); then
# `orders-api atk chaos` for 40 s, the server killed (kill -9) and started
# again on the same port and database every 15 s: its history must be
# consistent (and `atk history` must find the written file so too). Keeps the
# JUnit files and the histories per backend and prints where.
#
# Settings (environment):
#   TEST_DATABASE_URL  an admin URL of a PostgreSQL server whose user may create
#                      databases (CI's throwaway cluster); this script creates and
#                      drops its own database there. Unset: SQLite only (CI: an error).
#   ATK_REPORT_DIR     where the JUnit files go (default $CARGO_TARGET_DIR/atk)
#   CARGO_TARGET_DIR   where the debug binary is built (default target/)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/serve.sh

target=${CARGO_TARGET_DIR:-target}
binary=$target/debug/orders-api
reports=${ATK_REPORT_DIR:-$target/atk}
mkdir -p "$reports"
reports=$(cd "$reports" && pwd)
rm -f "$reports"/atk-*.xml "$reports"/chaos-*.xml "$reports"/chaos-*.jsonl

if [ -z "${TEST_DATABASE_URL:-}" ] && [ -n "${CI:-}" ] && [ "${CI:-}" != false ]; then
  echo "CI is set but TEST_DATABASE_URL is not: atk must run on PostgreSQL in CI" >&2
  exit 1
fi

# The debug binary (cargo test has built it already; this only checks).
cargo build --locked --quiet --bin orders-api

work=$(mktemp -d /tmp/orders-api-atk.XXXXXX)
server_pid=
pg_database=
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    # A server started by a restart is not this shell's child: poll (10 s at most).
    for _ in $(seq 1 100); do
      case $(ps -o stat= -p "$server_pid" 2>/dev/null) in '' | Z*) break ;; esac
      sleep 0.1
    done
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
}

# write_restart NAME URL LOG: writes $work/restart-NAME.sh, which kills the
# server whose pid is in $work/NAME.pid with SIGKILL, waits until it is gone
# (5 s at most), and starts it again on the same address and database, its
# pid in that file.
write_restart() {
  local name=$1 url=$2 log=$3
  cat >"$work/restart-$name.sh" <<RESTART
#!/bin/sh
old=\$(cat '$work/$name.pid')
kill -9 "\$old" 2>/dev/null
for _ in \$(seq 1 50); do
  case \$(ps -o stat= -p "\$old" 2>/dev/null) in '' | Z*) break ;; esac
  sleep 0.1
done
DATABASE_URL='$url' nohup '$binary' serve --bind '${address#http://}' >>'$log' 2>&1 </dev/null &
echo \$! >'$work/$name.pid'
RESTART
}
cleanup() {
  stop_server
  if [ -n "$pg_database" ]; then
    psql "$TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS $pg_database WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# attack NAME DATABASE_URL: serves DATABASE_URL on a free port, runs every
# check against it, writes $reports/atk-NAME.xml; non-zero when an attack was
# exposed, a check deviated from the contract, or a run without a token
# did not fail.
attack() {
  local name=$1 url=$2 log=$work/$1.log status=0 address= token_a token_b
  DATABASE_URL=$url "$binary" migrate
  token_a=$(DATABASE_URL=$url "$binary" keys create atk-user-a)
  token_b=$(DATABASE_URL=$url "$binary" keys create atk-user-b)

  DATABASE_URL=$url serve_on_free_port "$binary" "$log" || return 1

  echo "== orders-api atk against $address ($name)"
  ORDERS_API_TOKEN=$token_a ORDERS_API_TOKEN_B=$token_b \
    "$binary" atk --server "$address" --strict --format junit --out "$reports/atk-$name.xml" || status=$?

  # Without a token every control is refused 401: nothing is judged, and
  # the run must say so with a non-zero exit, not pass.
  echo "== orders-api atk against $address ($name) without a token: must judge nothing"
  local no_token=$work/$name-no-token
  if env -u ORDERS_API_TOKEN -u ORDERS_API_TOKEN_B "$binary" atk --server "$address" \
    --only ATK-01,ATK-03 >"$no_token.out" 2>"$no_token.err"; then
    echo "orders-api atk without a token exited 0 ($name):" >&2
    cat "$no_token.out" "$no_token.err" >&2
    status=1
  else
    tail -n 1 "$no_token.out"
  fi

  # Retrying clients through the runner's own fault-injecting proxy, the
  # server killed and restarted between rounds: a consistent history.
  echo "== orders-api atk chaos against $address ($name): 40 s, kill -9 and restart every 15 s"
  echo "$server_pid" >"$work/$name.pid"
  write_restart "$name" "$url" "$log"
  ORDERS_API_TOKEN=$token_a ORDERS_API_TOKEN_B=$token_b \
    "$binary" atk chaos --server "$address" --duration 40 --clients 8 \
    --restart-cmd "sh $work/restart-$name.sh" --restart-every 15 \
    --history "$reports/chaos-$name.jsonl" --format junit --out "$reports/chaos-$name.xml" || status=$?
  server_pid=$(cat "$work/$name.pid")
  echo "== orders-api atk history $reports/chaos-$name.jsonl"
  "$binary" atk history "$reports/chaos-$name.jsonl" | tail -n 1 || status=1

  if grep -qF -e "$token_a" -e "$token_b" "$log"; then
    echo "the server log contains a bearer token ($name)" >&2
    status=1
  fi
  stop_server
  if [ "$status" -ne 0 ]; then
    echo "--- last lines of the server log ($name) ---" >&2
    tail -n 40 "$log" >&2
  fi
  return "$status"
}

failed=0
attack sqlite "sqlite://$work/orders.db" || failed=1

if [ -n "${TEST_DATABASE_URL:-}" ]; then
  pg_database=orders_atk_$$
  psql "$TEST_DATABASE_URL" -qc "CREATE DATABASE $pg_database" >/dev/null
  # The admin URL with its database name replaced (its query string kept).
  admin=${TEST_DATABASE_URL%%\?*}
  query=${TEST_DATABASE_URL#"$admin"}
  attack postgres "${admin%/*}/$pg_database$query" || failed=1
fi

echo "== atk JUnit reports: $(ls "$reports"/atk-*.xml "$reports"/chaos-*.xml | tr '\n' ' ')"
echo "== chaos histories: $(ls "$reports"/chaos-*.jsonl | tr '\n' ' ')"
exit "$failed"
