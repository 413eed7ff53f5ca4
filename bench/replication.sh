#!/usr/bin/env bash
# Replication benchmark: RF=3 vs RF=1 produce throughput and p99 on a local
# 3-node cluster, and the client-visible pause of one failover (see
# bench/replication.py). Not a test; scripts/test.sh does not run it.
#
#   ./bench/replication.sh                     # 200k x 1 KiB per run, median of 3
#   ./bench/replication.sh --records 50000 --repeat 1
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$VENV/bin/python" bench/replication.py "$@" | tee bench-results/replication.md
