#!/usr/bin/env bash
# The failover test (examples/failover.rs says what it asserts): builds the
# service and the driver, starts a throwaway pg_auto_failover formation
# (scripts/pg-ha.sh, installing the packages when missing), runs three
# failovers under retrying clients, and removes everything on exit.
#
#   scripts/failover-test.sh                   # 8 clients
#   FAILOVER_CLIENTS=4 scripts/failover-test.sh
#   FAILOVER_TMP=/tmp/ha-mine scripts/failover-test.sh  # formation in /tmp/ha-mine.XXXXXX
#
# Bounded: the whole run is killed after FAILOVER_TIMEOUT seconds (600).
# About 2 to 2.5 minutes once built. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked --quiet --bin orders-api --example failover
target_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

dir=$(mktemp -d "${FAILOVER_TMP:-/tmp/orders-api-ha}.XXXXXX")
cleanup() {
  # The driver stops the service it started; if the driver itself was
  # killed (the timeout), the service is stopped here.
  [ -f "$dir/orders-api.pid" ] && kill "$(cat "$dir/orders-api.pid")" 2>/dev/null || true
  scripts/pg-ha.sh stop "$dir" || true
  # FAILOVER_KEEP=1 keeps the formation's files (logs, data) for a look.
  if [ -n "${FAILOVER_KEEP:-}" ]; then echo "== kept $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
echo "== starting a pg_auto_failover formation (monitor + 2 nodes, synchronous replication)"
started=$SECONDS
url=$(scripts/pg-ha.sh start "$dir")
echo "== formation up in $((SECONDS - started)) s: $url"

status=0
PG_HA_DIR=$dir PG_HA_URL=$url PG_HA_SCRIPT=$PWD/scripts/pg-ha.sh \
  ORDERS_API_BIN="$target_dir/debug/orders-api" \
  timeout --kill-after=10 "${FAILOVER_TIMEOUT:-600}" "$target_dir/debug/examples/failover" || status=$?
if [ "$status" != 0 ]; then
  echo "== the failover test failed ($status); the monitor's events:" >&2
  scripts/pg-ha.sh events "$dir" >&2 || true
  echo "== the service's log (last lines):" >&2
  tail -n 20 "$dir/orders-api.log" >&2 || true
fi
exit "$status"
