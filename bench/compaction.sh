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
# shellcheck source=bench/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

mkdir -p bench-results
"$VENV/bin/python" bench/compaction.py --json bench-results/compaction.json \
    --plot bench-results/compaction.png "$@" | tee bench-results/compaction.md
