#!/usr/bin/env bash
# tessera vs tansu with librdkafka's C client (rdkafka_performance), the
# two brokers alternating within every round (issue 28). Not a test.
#
#   ./bench/c_client.sh                                 # 300k x 1 KiB, none + lz4, 3 rounds
#   ./bench/c_client.sh --records 100000 --codecs lz4,zstd --rounds 5
#
# rdkafka_performance is built once from the librdkafka source the
# `rdkafka` crate bundles (rdkafka-sys, already in cargo's registry after
# any build of compat-tests), into bench-results/librdkafka; set
# RDKAFKA_PERFORMANCE to use another build (e.g. librdkafka 2.15.0's).
# shellcheck source=bench/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

tool=$(rdkafka_performance)

"$VENV/bin/python" bench/c_client.py --tool "$tool" --json bench-results/c_client.json "$@" |
    tee bench-results/c_client.md
