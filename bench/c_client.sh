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

tool=${RDKAFKA_PERFORMANCE:-}
if [ -z "$tool" ]; then
    tool="$ROOT/bench-results/librdkafka/examples/rdkafka_performance"
    if [ ! -x "$tool" ]; then
        src=$(cargo metadata --format-version 1 --manifest-path compat-tests/Cargo.toml |
            "$VENV/bin/python" -c 'import json, sys, pathlib
pkgs = json.load(sys.stdin)["packages"]
print(next(pathlib.Path(p["manifest_path"]).parent / "librdkafka" for p in pkgs if p["name"] == "rdkafka-sys"))')
        echo "==> building rdkafka_performance from $src" >&2
        rm -rf bench-results/librdkafka && cp -r "$src" bench-results/librdkafka
        (cd bench-results/librdkafka && ./configure --disable-gssapi --disable-curl >/dev/null &&
            make -j"$(nproc)" libs >/dev/null && make -C examples rdkafka_performance >/dev/null)
    fi
fi

"$VENV/bin/python" bench/c_client.py --tool "$tool" --json bench-results/c_client.json "$@" |
    tee bench-results/c_client.md
