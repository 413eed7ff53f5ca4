#!/usr/bin/env bash
# The single command that runs every Tessera test:
#   Rust: fmt check, clippy (-D warnings), release build, cargo test
#   compat: real Kafka clients (kcat, confluent-kafka, kafka-python) against a
#           real tessera process (compat-tests/python, pytest)
# Installs what it needs, idempotently: kcat (apt) if missing, a venv at
# ./.venv with compat-tests/python/requirements.txt, and kafkajs (npm, from
# compat-tests/node/package-lock.json; Node.js from apt if missing).
#
# Env knobs:
#   SKIP_RUST=1           skip fmt/clippy/build/test (compat tests only; the
#                         release binary must already exist)
#   PYTEST_ARGS="..."     extra pytest args (e.g. "-k admin -x")
#   COMPAT_CLUSTER=0      skip the compat files run again on a 3-node cluster
#   TESSERA_BIN=path      binary for the compat tests (default target/release/tessera)
#   FAULTS_CI=0|1         the fault-harness stage (scripts/faults.sh, about 7
#                         minutes in all; default FAULTS_CI_DEFAULT below)
#   FAULTS_SEED=N FAULTS_MINUTES=M FAULTS_NEMESES=a,b  its seed, length, nemeses
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

# The last line of every run is the verdict, whatever happened before it:
#   ==> RESULT: PASSED (all stages)
#   ==> RESULT: FAILED (stages: cargo clippy, compat tests)
# and the exit code is non-zero whenever that line says FAILED. A setup step
# that aborts the script (set -e) is reported as failed the same way.
failed=()
timings=()
skipped_summary=""
current="setup"
step() { current="$*"; printf '\n==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
finish() {
    local rc=$?
    trap - EXIT
    if [ "$rc" -ne 0 ] && [ ${#failed[@]} -eq 0 ]; then
        failed+=("$current (exit $rc)")
    fi
    if [ ${#timings[@]} -gt 0 ]; then
        printf '\n==> stage wall times: %s (total %ss)\n' "$(printf '%s, ' "${timings[@]}" | sed 's/, $//')" "$SECONDS"
    fi
    if [ ${#failed[@]} -eq 0 ]; then
        printf '\n==> RESULT: PASSED (all stages%s)\n' "$skipped_summary"
        exit 0
    fi
    local list
    list=$(printf '%s, ' "${failed[@]}")
    printf '\n==> RESULT: FAILED (stages: %s%s)\n' "${list%, }" "$skipped_summary"
    [ "$rc" -ne 0 ] || rc=1
    exit "$rc"
}
trap finish EXIT
trap 'failed+=("interrupted during: $current"); exit 130' INT
trap 'failed+=("terminated during: $current"); exit 143' TERM

# ---- tools -----------------------------------------------------------------
if ! command -v kcat >/dev/null 2>&1; then
    step "installing kcat (apt)"
    as_root apt-get update
    as_root apt-get install -y kcat
fi

if ! command -v openssl >/dev/null 2>&1; then
    step "installing openssl (apt; test_tls.py makes its certificates with it)"
    as_root apt-get update
    as_root apt-get install -y openssl
fi

if ! command -v gcc >/dev/null 2>&1; then
    step "installing gcc (apt; test_fsync_failure.py builds its fault-injection shim with it)"
    as_root apt-get update
    as_root apt-get install -y gcc
fi

if ! command -v chromium >/dev/null 2>&1; then
    step "installing chromium (apt; test_console.py drives the console in it with playwright-core)"
    as_root apt-get update
    as_root apt-get install -y chromium
fi

# shellcheck source=scripts/python-env.sh
. "$ROOT/scripts/python-env.sh"
ensure_venv

# kafkajs for compat-tests/node (Node.js and npm from Debian when missing).
if ! command -v npm >/dev/null 2>&1; then
    step "installing nodejs and npm (apt)"
    as_root apt-get update
    as_root apt-get install -y nodejs npm
fi
NODE_DIR="$ROOT/compat-tests/node"
node_stamp="$NODE_DIR/node_modules/.compat-lock.sha256"
node_want=$(sha256sum "$NODE_DIR/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$node_stamp" 2>/dev/null || true)" != "$node_want" ]; then
    step "installing npm packages into compat-tests/node"
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund)
    echo "$node_want" > "$node_stamp"
fi

# ---- Rust ------------------------------------------------------------------
# Every stage runs even if an earlier one failed (so one run shows every
# problem), except that nothing is tested without a successful build. The exit
# code is non-zero if any stage failed, and the last line is the RESULT line
# (see finish above), never a stage's own summary.
run_stage() {
    local name=$1 title=$2; shift 2
    step "$title"
    local rc=0 started=$SECONDS
    "$@" || rc=$?
    timings+=("$name $((SECONDS - started))s")
    printf -- '--- %s: %ss\n' "$name" "$((SECONDS - started))"
    if [ $rc -ne 0 ]; then
        failed+=("$name")
        echo "!!! stage failed: $name (exit $rc)" >&2
    fi
    return $rc
}

if [ "${SKIP_RUST:-0}" != "1" ]; then
    run_stage "cargo fmt" "cargo fmt --all --check" cargo fmt --all --check || true
    run_stage "cargo clippy" "cargo clippy" \
        cargo clippy --workspace --all-targets --release -- -D warnings || true
    if ! run_stage "cargo build" "cargo build --release --workspace" \
        cargo build --release --workspace; then
        echo "build failed; not running tests" >&2
        exit 1
    fi
    run_stage "cargo test" "cargo test --release --workspace --no-fail-fast" \
        cargo test --release --workspace --no-fail-fast || true
fi

# ---- real-client compatibility tests ----------------------------------------
export TESSERA_BIN="${TESSERA_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/tessera}"
if [ ! -x "$TESSERA_BIN" ]; then
    echo "tessera binary missing: $TESSERA_BIN" >&2
    failed+=("compat tests (binary missing)")
    exit 1
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "!!! failed so far: ${failed[*]} (the run will exit non-zero)" >&2
fi
cd "$ROOT/compat-tests/python"
rc=0
# pytest's output is kept (target/pytest.log) so that the verdict line can
# say how many tests were skipped and why (-rs lists each skip's reason).
PYTEST_LOG="${CARGO_TARGET_DIR:-$ROOT/target}/pytest.log"
mkdir -p "$(dirname "$PYTEST_LOG")"
run_pytest() {
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pytest -v -rs --durations=25 ${PYTEST_ARGS:-} . 2>&1 | tee "$PYTEST_LOG"
}
run_stage "compat tests" "compat tests (pytest compat-tests/python)" run_pytest || rc=$?
skips=$(awk -F'[][]' '/^SKIPPED \[/ { n += $2 } END { print n + 0 }' "$PYTEST_LOG")
if [ "${skips:-0}" -gt 0 ]; then
    reasons=$(grep '^SKIPPED \[' "$PYTEST_LOG" | sed 's/^SKIPPED \[[0-9]*\] [^:]*:[0-9]*: //' | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)
    skipped_summary="; $skips compat test(s) skipped: $reasons"
fi

# ---- the same real-client tests on a 3-node cluster ---------------------------
# Issue 24: the compat suite on `tessera cluster --nodes 3` as well as on one
# node (COMPAT_BROKER=cluster: the clients bootstrap from all three nodes),
# the files whose tests are about client behaviour (about 5 minutes);
# tests that read one broker's own state skip there (Broker.single_node).
CLUSTER_COMPAT_FILES="test_client_roundtrip.py test_compression.py test_transactions.py
    test_groups.py test_groups_kip848.py test_other_clients.py test_kcat.py
    test_consumer_positions.py test_commit_order.py test_ordering.py test_admin.py
    test_defaults.py test_kafka_tools.py"
run_cluster_pytest() {
    # shellcheck disable=SC2086
    COMPAT_BROKER=cluster "$VENV/bin/python" -m pytest -v -rs --durations=10 ${PYTEST_ARGS:-} \
        $CLUSTER_COMPAT_FILES 2>&1 | tee "$PYTEST_LOG.cluster"
}
if [ "${COMPAT_CLUSTER:-1}" = "1" ]; then
    crc=0
    run_stage "compat tests on a cluster" "compat tests on tessera cluster --nodes 3 (COMPAT_BROKER=cluster)" \
        run_cluster_pytest || crc=$?
    [ $rc -ne 0 ] || rc=$crc
fi

# ---- fault harness (docs/RELIABILITY.md) -------------------------------------
# A short seeded run: 3 nodes, a few minutes of mixed faults, the checker's
# verdict. Needs root (network namespaces), as CI has. Range splits and
# merges are in (clean on this command twice, and seed 9's 35 minutes of
# every nemesis clean: docs/RELIABILITY.md, 2026-12-06 noon); crash-all and
# fsync-fail stay for manual runs (`./scripts/faults.sh`, all nemeses by
# default) while the record stored twice after them (finding 6) is open.
FAULTS_CI_DEFAULT=1
if [ "${FAULTS_CI:-$FAULTS_CI_DEFAULT}" = "1" ]; then
    cd "$ROOT"
    frc=0
    run_stage "fault harness" "fault harness (scripts/faults.sh, seed ${FAULTS_SEED:-1})" \
        ./scripts/faults.sh --minutes "${FAULTS_MINUTES:-3}" --seed "${FAULTS_SEED:-1}" \
        --nodes 3 --nemeses "${FAULTS_NEMESES:-kill,crash,pause,partition,fsync-hang,join,leave,split,merge}" \
        --keep "$ROOT/target/fault-runs/ci" || frc=$?
    [ $rc -ne 0 ] || rc=$frc
fi
# finish (the EXIT trap) prints the RESULT line; keep pytest's own exit code
# (1 tests failed, 2 interrupted, ...) when pytest is what failed.
exit $rc
