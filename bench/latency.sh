#!/usr/bin/env bash
# Produce and end-to-end latency, p50/p99/p99.9, at 50 % and 80 % of the
# maximum rate, in the OpenMessaging Benchmark's workload shape (issue 28):
# tessera one node, tessera 3-node RF=3, tansu. Not a test.
#
#   ./bench/latency.sh                                  # every broker, linger.ms 0 and 5, 20 s a row
#   ./bench/latency.sh --brokers tessera --lingers 5 --seconds 10
# shellcheck source=bench/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

echo "==> cargo build --release -p tessera-compat-tests --example latency" >&2
cargo build --release -p tessera-compat-tests --example latency >&2
"$VENV/bin/python" bench/latency.py --driver "$ROOT/target/release/examples/latency" \
    --json bench-results/latency.json "$@" | tee bench-results/latency.md
