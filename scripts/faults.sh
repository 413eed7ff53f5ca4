#!/usr/bin/env bash
# The fault harness (issue 26; docs/RELIABILITY.md): a cluster of real
# tessera processes, each node in its own network namespace, under nemeses
# mixed at random from a seed, with queue and transactional workloads and a
# checker over everything read back after healing.
#
#   ./scripts/faults.sh --minutes 3 --seed 7 [--nodes 3|5]
#       [--nemeses kill,crash,pause,partition,fsync-fail,fsync-hang,join,leave,split,merge]
#       [--keep DIR] [-o key=value ...] [--self-test]
#
# Exit code 0: no anomaly; 1: anomalies (or a stuck worker); the table of
# faults and anomalies is printed last. Needs root (ip netns). Installs what
# it needs, idempotently: iproute2 and gcc (apt), the venv at ./.venv.
# TESSERA_BIN=path runs that binary; otherwise the release build is brought
# up to date (cargo build --release -p tessera-gateway).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
step() { printf '==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if [ "$(id -u)" -ne 0 ]; then
    echo "faults.sh needs root (network namespaces): sudo $0 $*" >&2
    exit 2
fi

self_test=0
for a in "$@"; do [ "$a" = "--self-test" ] && self_test=1; done

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]} (apt)"
    as_root apt-get update
    as_root apt-get install -y "${missing[@]}"
fi
# shellcheck source=scripts/python-env.sh
. "$ROOT/scripts/python-env.sh"
ensure_venv

if [ $self_test -eq 0 ] && [ -z "${TESSERA_BIN:-}" ]; then
    step "cargo build --release -p tessera-gateway"
    cargo build --release -p tessera-gateway
fi
export TESSERA_BIN="${TESSERA_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/tessera}"
cd "$ROOT/compat-tests/python"
exec "$VENV/bin/python" -m faults "$@"
