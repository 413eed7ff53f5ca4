#!/usr/bin/env bash
# The single command that runs every Tessera test:
#   Rust: fmt check, clippy (-D warnings), release build, cargo test
#   compat: real Kafka clients (kcat, confluent-kafka, kafka-python) against a
#           real tessera process (compat-tests/python, pytest)
# Installs what it needs, idempotently: kcat (apt) if missing, and a venv at
# ./.venv with compat-tests/python/requirements.txt.
#
# Env knobs:
#   SKIP_RUST=1           skip fmt/clippy/build/test (compat tests only; the
#                         release binary must already exist)
#   PYTEST_ARGS="..."     extra pytest args (e.g. "-k admin -x")
#   TESSERA_BIN=path      binary for the compat tests (default target/release/tessera)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
REQS="$ROOT/compat-tests/python/requirements.txt"

step() { printf '\n==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# ---- tools -----------------------------------------------------------------
if ! command -v kcat >/dev/null 2>&1; then
    step "installing kcat (apt)"
    as_root apt-get update
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y kcat
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for c in python3.11 python3; do
        if command -v "$c" >/dev/null 2>&1; then PY=$c; break; fi
    done
fi
[ -n "$PY" ] || { echo "python3 not found" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
    step "creating venv at $VENV"
    if ! "$PY" -m venv "$VENV"; then
        # Debian's python needs the venv module from its own package
        rm -rf "$VENV"
        ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        as_root apt-get update
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y "python${ver}-venv" || \
            DEBIAN_FRONTEND=noninteractive as_root apt-get install -y python3-venv
        "$PY" -m venv "$VENV"
    fi
fi

# Reinstall only when requirements.txt changed (stamp = its sha256).
stamp="$VENV/.compat-requirements.sha256"
want=$(sha256sum "$REQS" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    step "installing python packages into $VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQS"
    echo "$want" > "$stamp"
fi

# ---- Rust ------------------------------------------------------------------
if [ "${SKIP_RUST:-0}" != "1" ]; then
    step "cargo fmt --all --check"
    cargo fmt --all --check

    step "cargo clippy --workspace --all-targets --release -- -D warnings"
    cargo clippy --workspace --all-targets --release -- -D warnings

    step "cargo build --release --workspace"
    cargo build --release --workspace

    step "cargo test --release --workspace"
    cargo test --release --workspace
fi

# ---- real-client compatibility tests ----------------------------------------
step "compat tests (pytest compat-tests/python)"
export TESSERA_BIN="${TESSERA_BIN:-$ROOT/target/release/tessera}"
[ -x "$TESSERA_BIN" ] || { echo "tessera binary missing: $TESSERA_BIN" >&2; exit 1; }
cd "$ROOT/compat-tests/python"
# shellcheck disable=SC2086
exec "$VENV/bin/python" -m pytest -v ${PYTEST_ARGS:-} .
