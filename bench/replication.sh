#!/usr/bin/env bash
# Replication benchmark: RF=3 vs RF=1 produce throughput and p99 on a local
# 3-node cluster, and the client-visible pause of one failover (see
# bench/replication.py). Not a test; scripts/test.sh does not run it.
#
#   ./bench/replication.sh                     # 200k x 1 KiB per run, median of 3
#   ./bench/replication.sh --records 50000 --repeat 1
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -c 'import confluent_kafka' 2>/dev/null ||
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r compat-tests/python/requirements.txt
if [ -z "${TESSERA_BIN:-}" ]; then
    cargo build --release -p tessera-gateway >&2
    export TESSERA_BIN="$ROOT/target/release/tessera"
fi
mkdir -p bench-results
"$VENV/bin/python" bench/replication.py "$@" | tee bench-results/replication.md
