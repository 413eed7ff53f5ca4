#!/usr/bin/env bash
# How cost grows on one node (issue 28): produce/consume rate, latency and
# memory by partitions, producer connections, record size and ranges.
# Not a test.
#
#   ./bench/growth.sh                                   # every sweep, tables + docs-ready PNG
#   ./bench/growth.sh --quick --sweeps partitions,sizes
# shellcheck source=bench/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

tool=$(rdkafka_performance)
echo "==> cargo build --release -p tessera-compat-tests --example latency" >&2
cargo build --release -p tessera-compat-tests --example latency >&2
"$VENV/bin/python" bench/growth.py --binary "$TESSERA_BIN" --tool "$tool" \
    --driver "$ROOT/target/release/examples/latency" --json bench-results/growth.json \
    --png bench-results/growth.png "$@" | tee bench-results/growth.md
