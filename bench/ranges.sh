#!/usr/bin/env bash
# Ranges benchmark: RSS and files for 10,000-partition topics, and produce
# throughput to one at 1, 2 and 4 ranges (see bench/README.md). Not a test;
# scripts/test.sh does not run it.
#
#   ./bench/ranges.sh                          # 200k x 1 KiB per run, median of 3, ~2-4 min
#   ./bench/ranges.sh --records 50000 --repeat 1 --no-perf
#   TESSERA_BIN=/path/to/tessera ./bench/ranges.sh   # skip the cargo build
#
# Markdown results go to stdout (and bench-results/ranges.md), progress to
# stderr, raw JSON to bench-results/ranges.json.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$VENV/bin/python" bench/ranges.py --json bench-results/ranges.json "$@" | tee bench-results/ranges.md
