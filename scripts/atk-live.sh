#!/usr/bin/env bash
# The attack suite as a user runs it: `orders-api atk` against a live
# `orders-api serve`, on SQLite and on PostgreSQL, with two users' tokens and
# --strict (every attack BLOCKED, no deviation from the contract), and once
# without a token (nothing can be judged: it must exit non-zero). Keeps one
# JUnit file per backend and prints where.
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
rm -f "$reports"/atk-*.xml

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
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
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

echo "== atk JUnit reports: $(ls "$reports"/atk-*.xml | tr '\n' ' ')"
exit "$failed"
