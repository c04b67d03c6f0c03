#!/usr/bin/env bash
# The load benchmark of docs/PERFORMANCE.md (examples/bench/main.rs says what it
# measures). Builds the release binary and the benchmark, installs wrk (and
# pgbench for PostgreSQL) when missing, then runs it.
#
#   scripts/bench.sh                                        # SQLite, temp file
#   BENCH_DATABASE_URL=postgres://USER@HOST/DB scripts/bench.sh
#   BENCH_SECONDS=8 BENCH_CONNECTIONS=32 BENCH_PROCESSES=2 scripts/bench.sh
#
# On PostgreSQL it creates (and drops) a database of its own next to the one
# the URL names, so the role needs CREATEDB. Measure with fsync on.
set -euo pipefail
cd "$(dirname "$0")/.."

install() {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "bench: please install $* (apt-get install $*)" >&2
    exit 1
  fi
}
command -v wrk >/dev/null || install wrk
if [ -n "${BENCH_DATABASE_URL:-}" ]; then
  command -v pgbench >/dev/null || install postgresql-client
fi

cargo build --release --locked --bin orders-api --example bench
target_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
ORDERS_API_BIN="$target_dir/release/orders-api" exec "$target_dir/release/examples/bench"
