#!/usr/bin/env bash
# Produce and end-to-end latency, p50/p99/p99.9, at 50 % and 80 % of the
# maximum rate, in the OpenMessaging Benchmark's workload shape (issue 28):
# tessera one node, tessera 3-node RF=3, tansu. Not a test.
#
#   ./bench/latency.sh                                  # every broker, linger.ms 0 and 5, 20 s a row
#   ./bench/latency.sh --brokers tessera --lingers 5 --seconds 10
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"

PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp="$VENV/.bench-requirements.sha256"
want=$(cat compat-tests/python/requirements.txt bench/requirements.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q \
        -r compat-tests/python/requirements.txt -r bench/requirements.txt
    echo "$want" > "$stamp"
fi

echo "==> cargo build --release (the latency driver${TESSERA_BIN:+; tessera from TESSERA_BIN})" >&2
cargo build --release -p tessera-compat-tests --example latency >&2
if [ -z "${TESSERA_BIN:-}" ]; then
    cargo build --release -p tessera-gateway >&2
    export TESSERA_BIN="$ROOT/target/release/tessera"
fi

mkdir -p bench-results
"$VENV/bin/python" bench/latency.py --driver "$ROOT/target/release/examples/latency" \
    --json bench-results/latency.json "$@" | tee bench-results/latency.md
