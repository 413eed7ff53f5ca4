#!/usr/bin/env bash
# Spread primaries benchmark: one 12-partition RF=3 topic led by one broker vs
# spread over three (see
# bench/spread.py). Not a test; scripts/test.sh does not run it.
#
#   ./bench/spread.sh                     # 200k x 1 KiB per run, median of 3
#   ./bench/spread.sh --records 50000 --repeat 1
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$VENV/bin/python" bench/spread.py "$@" | tee bench-results/spread.md
