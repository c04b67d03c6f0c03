#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of client input (see
# docs/SECURITY.md): runs each target of fuzz/ for SECONDS (default 600),
# two at a time, at low priority, with debug assertions (overflow checks)
# on. Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# The fuzzer starts from fuzz/corpus/<target> (committed, minimised) and
# fuzz/seeds/<target> (hand-written cases, committed); new inputs go to
# fuzz/corpus-run/<target> (not committed); each run's log,
# whose last lines give executions and coverage, to fuzz/logs/<target>.log.
# A crash or a broken invariant leaves its input in fuzz/artifacts/<target>/
# and makes the script exit non-zero. To refresh the committed corpus (the
# smallest set with the same edge coverage; `cargo test` replays it):
#   cp -n fuzz/corpus-run/<target>/* fuzz/corpus/<target>/
#   cargo +nightly fuzz cmin -s none --debug-assertions <target> fuzz/corpus/<target> -- -use_counters=0
set -euo pipefail

seconds=${1:-600}
shift || true
cd "$(dirname "$0")/../fuzz"
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=(money create_body patch_body idempotency_key fingerprint cursor client_args outbox_read history settings media_type)
fi
flags=(-s none --debug-assertions)

mkdir -p logs
nice -n 19 cargo +nightly fuzz build "${flags[@]}"

run() {
    local target=$1
    mkdir -p "corpus-run/$target" "corpus/$target"
    nice -n 19 cargo +nightly fuzz run "${flags[@]}" "$target" \
        "corpus-run/$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -print_final_stats=1 >"logs/$target.log" 2>&1
}

status=0
pids=()
for target in "${targets[@]}"; do
    run "$target" &
    pids+=("$!")
    if [ "${#pids[@]}" -ge 2 ]; then
        wait "${pids[0]}" || status=1
        pids=("${pids[@]:1}")
    fi
done
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
for target in "${targets[@]}"; do
    echo "$target: $(grep -E '^#[0-9]+' "logs/$target.log" | tail -1)"
    grep -E 'stat::number_of_executed_units' "logs/$target.log" || true
done
exit "$status"
