#!/usr/bin/env bash
# Mutation testing of the request path with cargo-mutants (crates.io): each
# mutant of the idempotency ledger's request path, the SQLite writer, and the
# server's mutating route must make a test fail, or be named in
# docs/MUTANTS.md with why it cannot change behaviour.
#
#   scripts/mutants.sh              # every file of the request path
#   scripts/mutants.sh FILE...      # some of them (paths from the repository root)
#
# Slow (every mutant rebuilds a test binary): run it by hand, never in CI.
# Each mutant is tested in two rounds, the cheap one first:
#   1. the ledger's mutants against the ledger crate's own tests;
#   2. those that survived, and the route's, against the server's
#      integration tests of the request path (`--test api`, filtered).
# With TEST_DATABASE_URL set (a server whose user may create databases) the
# PostgreSQL copies of the tests run too. MUTANT_TIMEOUT (seconds, default
# 900) bounds each mutant's server tests (the ledger's own, which take
# seconds, 20 s); MUTANTS_OUT (default target/mutants) is
# where each round writes its mutants.out/ (caught.txt, missed.txt,
# timeout.txt, unviable.txt). cargo-mutants builds in a copy of the tree;
# MUTANTS_IN_PLACE=1 mutates this tree instead (each file is restored after
# its mutants; edit nothing meanwhile), which reuses CARGO_TARGET_DIR's
# build of it. MUTANTS_RESUME=1 goes on from an interrupted run (what it
# caught already is skipped). MUTANTS_RE=REGEX tests only the mutants whose
# name matches (cargo-mutants' --re), e.g. 'in commit|replace commit'.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-mutants >/dev/null 2>&1 || cargo install --locked cargo-mutants

ledger_files=(
  crates/idempotency-ledger/src/protocol.rs
  crates/idempotency-ledger/src/ledger.rs
  crates/idempotency-ledger/src/work.rs
  crates/idempotency-ledger/src/inflight.rs
  crates/idempotency-ledger/src/admission.rs
  crates/idempotency-ledger/src/remembered.rs
  crates/idempotency-ledger/src/entry.rs
  crates/idempotency-ledger/src/row.rs
  crates/idempotency-ledger/src/response.rs
  crates/idempotency-ledger/src/pool.rs
  crates/idempotency-ledger/src/options.rs
  crates/idempotency-ledger/src/sqlite/pool.rs
  crates/idempotency-ledger/src/sqlite/writer/batch.rs
  crates/idempotency-ledger/src/sqlite/writer/fence.rs
  crates/idempotency-ledger/src/sqlite/writer/handle.rs
  crates/idempotency-ledger/src/sqlite/writer/queue.rs
  crates/idempotency-ledger/src/sqlite/writer/shared.rs
  crates/idempotency-ledger/src/sqlite/writer/slot.rs
  crates/idempotency-ledger/src/sqlite/writer/watchdog.rs
  crates/idempotency-ledger/src/pg/pool.rs
  crates/idempotency-ledger/src/pg/create.rs
  crates/idempotency-ledger/src/pg/lock.rs
)
route_files=(src/http/mutation.rs)
if [ $# -gt 0 ]; then
  ledger_files=() route_files=()
  for f in "$@"; do
    case $f in
      crates/idempotency-ledger/*) ledger_files+=("$f") ;;
      src/*) route_files+=("$f") ;;
      *) echo "mutants.sh: $f is not on the request path" >&2; exit 2 ;;
    esac
  done
fi
# The integration tests that cover the request path; the route also reads
# and refuses request bodies before the ledger sees them.
api_tests=(idempotency race lease seams bounds group_commit row_paths crash writer_bounds statements)
route_tests=("${api_tests[@]}" bodies problems orders)
# MUTANTS_TESTS="a b …" runs only those integration tests in round 2 (for
# a file whose mutants only some of them reach, e.g. the SQLite writer's).
if [ -n "${MUTANTS_TESTS:-}" ]; then
  read -ra api_tests <<< "$MUTANTS_TESTS"
  route_tests=("${api_tests[@]}")
fi
out=${MUTANTS_OUT:-target/mutants}
timeout=${MUTANT_TIMEOUT:-900}
mkdir -p "$out/ledger" "$out/route"
common=(--baseline skip --colors never)
[ -n "${MUTANTS_RE:-}" ] && common+=(--re "$MUTANTS_RE")
if [ "${MUTANTS_IN_PLACE:-0}" = 1 ]; then
  common+=(--in-place)
else
  common+=(--jobs 1)
fi

as_args() { local flag=$1; shift; for f in "$@"; do printf '%s\0%s\0' "$flag" "$f"; done; }

if [ ${#ledger_files[@]} -gt 0 ]; then
  mapfile -d '' files < <(as_args --file "${ledger_files[@]}")
  echo "== round 1: the ledger's mutants against the ledger's own tests"
  cargo mutants "${common[@]}" --timeout 20 -p idempotency-ledger "${files[@]}" ${MUTANTS_RESUME:+--iterate} \
    --test-package idempotency-ledger --output "$out/ledger" -- --tests || true
  echo "== round 2: the survivors against the server's tests of the request path"
  # --iterate skips what round 1 caught (and what did not build).
  cargo mutants "${common[@]}" --timeout "$timeout" -p idempotency-ledger "${files[@]}" --iterate \
    --test-package orders-api --output "$out/ledger" -- --test api -- "${api_tests[@]}" || true
fi
if [ ${#route_files[@]} -gt 0 ]; then
  mapfile -d '' files < <(as_args --file "${route_files[@]}")
  echo "== the route's mutants against the server's tests of the request path"
  cargo mutants "${common[@]}" --timeout "$timeout" -p orders-api "${files[@]}" ${MUTANTS_RESUME:+--iterate} \
    --output "$out/route" -- --test api -- "${route_tests[@]}" || true
fi

for round in "$out"/ledger "$out"/route; do
  [ -d "$round/mutants.out" ] || continue
  echo "== $round"
  for outcome in caught missed timeout unviable; do
    printf '%-9s %s\n' "$outcome" "$(wc -l < "$round/mutants.out/$outcome.txt" 2>/dev/null || echo 0)"
  done
  if [ -s "$round/mutants.out/missed.txt" ]; then
    echo "missed (each must be killed by a test or named in docs/MUTANTS.md):"
    sed 's/^/  /' "$round/mutants.out/missed.txt"
  fi
done
