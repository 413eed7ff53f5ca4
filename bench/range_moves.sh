#!/usr/bin/env bash
# Range-moves benchmark: produce throughput and latency to a 32-partition
# topic with no moves, with splits/merges forced every 100 ms, and with the
# automatic policy at low thresholds (see bench/README.md). Not a test;
# scripts/test.sh does not run it.
#
#   ./bench/range_moves.sh                           # 200k x 1 KiB per run, median of 3
#   ./bench/range_moves.sh --records 50000 --repeat 1
#   TESSERA_BIN=/path/to/tessera ./bench/range_moves.sh   # skip the cargo build
#
# Markdown results go to stdout (and bench-results/range_moves.md), progress to
# stderr, raw JSON to bench-results/range_moves.json.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$VENV/bin/python" bench/range_moves.py --json bench-results/range_moves.json "$@" | tee bench-results/range_moves.md
