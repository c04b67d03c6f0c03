#!/usr/bin/env bash
# The web client (/app/) in a real browser: Debian's Chromium, headless,
# driven by playwright-core with node's own test runner (tests/browser/),
# against the release binary, on SQLite and on PostgreSQL. Installs what is
# missing (apt: chromium, nodejs, npm, the PostgreSQL client and, without
# TEST_DATABASE_URL, server; npm ci in tests/browser, with no browser
# download), builds, runs both backends (each test's database is dropped
# after it), and cleans up what it started.
#
# Settings (environment):
#   TEST_DATABASE_URL          an admin URL of a PostgreSQL server whose user may
#                              create databases (CI's cluster); each test creates
#                              its own database there. Unset: a throwaway cluster
#                              is started with scripts/pg-cluster.sh and stopped.
#   BROWSER_TEST_SCREENSHOTS   a folder for the screenshots the SQLite run takes
#                              (docs/img to refresh the documentation's); default:
#                              a temporary folder, removed afterwards.
#   CARGO_TARGET_DIR           where the release binary is built (default target/)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v psql >/dev/null || need+=(postgresql-client)
if [ -z "${TEST_DATABASE_URL:-}" ]; then
  ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need+=(postgresql)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "browser-test.sh: playwright-core needs Node.js 20 or newer; this is $(node --version)" >&2
  exit 1
fi

echo "== npm ci (tests/browser: playwright-core, no browser download)"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
(cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)

echo "== cargo build --release"
cargo build --release --locked --quiet --bin orders-api
target=${CARGO_TARGET_DIR:-target}
ORDERS_API_BIN=$(cd "$target/release" && pwd)/orders-api
export ORDERS_API_BIN

work=$(mktemp -d /tmp/orders-api-browser.XXXXXX)
pgdir=
cleanup() {
  if [ -n "$pgdir" ]; then scripts/pg-cluster.sh stop "$pgdir" || true; rm -rf "$pgdir"; fi
  rm -rf "$work"
}
trap cleanup EXIT

shots=${BROWSER_TEST_SCREENSHOTS:-$work/screenshots}
mkdir -p "$shots"
shots=$(cd "$shots" && pwd)

# Each test file run has its own deadline; every wait inside is bounded too.
run() {
  (cd tests/browser && timeout --kill-after=10 900 node --test --test-concurrency=1 --test-reporter=spec app.test.js)
}

echo "== the page's pure parts, in node"
(cd tests/browser && node --test --test-reporter=spec units.test.js)

echo "== browser tests on SQLite"
start=$SECONDS
BROWSER_TEST_SCREENSHOTS=$shots run
echo "   SQLite: $((SECONDS - start)) s"

if [ -n "${TEST_DATABASE_URL:-}" ]; then
  pg_url=$TEST_DATABASE_URL
else
  pgdir=$(mktemp -d /tmp/orders-api-browser-pg.XXXXXX)
  echo "== starting a throwaway PostgreSQL cluster"
  pg_url=$(scripts/pg-cluster.sh start "$pgdir")
fi
echo "== browser tests on PostgreSQL"
mkdir -p "$work/screenshots-pg"
start=$SECONDS
BROWSER_TEST_DATABASE_URL=$pg_url BROWSER_TEST_SCREENSHOTS=$work/screenshots-pg run
echo "   PostgreSQL: $((SECONDS - start)) s"
