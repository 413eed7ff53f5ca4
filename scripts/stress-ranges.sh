#!/usr/bin/env bash
# Runs the range-move stress test (compat-tests/python/test_range_stress.py:
# 8 idempotent producers against splits and merges every 100 ms) N times and
# reports how many runs passed. Not part of scripts/test.sh, which runs the
# test once with the rest of the suite.
#
#   ./scripts/stress-ranges.sh                 # 20 runs of 200,000 records
#   ./scripts/stress-ranges.sh 5               # 5 runs
#   STRESS_RECORDS=50000 ./scripts/stress-ranges.sh 50
#   TESSERA_BIN=/path/to/tessera ./scripts/stress-ranges.sh   # default target/release/tessera
#
# Every run's pytest output (with the broker log tail when it failed) goes to
# stress-results/run-<n>.log. A failed run's broker dir (data and the whole
# broker log, tessera.log) is kept and named; STRESS_KEEP_DATA=1 keeps the
# passing runs' dirs too. Other knobs: STRESS_PRODUCERS,
# STRESS_MOVE_MS, STRESS_MIN_MOVES, STRESS_SEED (see the test's docstring).
# Exit status: 0 if every run passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
RUNS=${1:-20}
VENV="$ROOT/.venv"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import confluent_kafka, pytest_timeout' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r compat-tests/python/requirements.txt || exit 1
fi
export TESSERA_BIN=${TESSERA_BIN:-$ROOT/target/release/tessera}
if [ ! -x "$TESSERA_BIN" ]; then
    echo "tessera binary not found at $TESSERA_BIN (cargo build --release -p tessera-gateway, or set TESSERA_BIN)" >&2
    exit 2
fi
# conftest keeps every broker dir; this script removes the passing runs' ones.
export COMPAT_KEEP_DATA=1

OUT="$ROOT/stress-results"
mkdir -p "$OUT"
echo "==> $RUNS run(s) of test_range_stress.py against $TESSERA_BIN (records: ${STRESS_RECORDS:-200000}); logs in $OUT" >&2
passed=0
failed_runs=()
for ((n = 1; n <= RUNS; n++)); do
    start=$(date +%s)
    (cd compat-tests/python && "$VENV/bin/python" -m pytest -q -s -p no:cacheprovider \
        test_range_stress.py) >"$OUT/run-$n.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    summary=$(grep -oE "(produced for [0-9.]+ s: [0-9,]+ acknowledged|moves: [0-9]+ splits, [0-9]+ merges)" "$OUT/run-$n.log" | tr "\n" " ")
    dir=$(grep -oE 'broker dir [^ ]+' "$OUT/run-$n.log" | head -1 | cut -d' ' -f3)
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        echo "run $n/$RUNS: PASS in ${secs}s  $summary"
        [ "${STRESS_KEEP_DATA:-0}" = 1 ] || { [ -n "$dir" ] && rm -rf "$dir"; }
    else
        failed_runs+=("$n")
        echo "run $n/$RUNS: FAIL (pytest exit $rc) in ${secs}s  $summary"
        grep -E '^E ' "$OUT/run-$n.log" | head -8 | cut -c1-400 | sed 's/^/    /'
        [ -n "$dir" ] && echo "    broker dir kept: $dir (log: $dir/tessera.log)"
    fi
done
echo "passed $passed of $RUNS${failed_runs[*]:+; failed runs: ${failed_runs[*]} (logs: $OUT/run-<n>.log)}"
[ "$passed" -eq "$RUNS" ]
