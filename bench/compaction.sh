#!/usr/bin/env bash
# Log cleaner benchmark: cleaner MB/s, produce latency while it runs, and
# disk use under steady load with retention / compaction (see
# bench/compaction.py). Not a test; scripts/test.sh does not run it.
#
#   ./bench/compaction.sh                          # 200k x 1 KiB, 60 s steady load
#   ./bench/compaction.sh --records 50000 --steady-s 30
#   TESSERA_BIN=/path/to/tessera ./bench/compaction.sh   # skip the cargo build
#
# Markdown to stdout and bench-results/compaction.md, raw JSON to
# bench-results/compaction.json, the disk-use plot to bench-results/compaction.png.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"

PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -c 'import confluent_kafka, matplotlib' 2>/dev/null ||
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q \
        -r compat-tests/python/requirements.txt -r bench/requirements.txt

if [ -z "${TESSERA_BIN:-}" ]; then
    echo "==> cargo build --release -p tessera-gateway" >&2
    cargo build --release -p tessera-gateway >&2
    export TESSERA_BIN="$ROOT/target/release/tessera"
fi

mkdir -p bench-results
"$VENV/bin/python" bench/compaction.py --json bench-results/compaction.json \
    --plot bench-results/compaction.png "$@" | tee bench-results/compaction.md
