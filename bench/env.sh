# Sourced by the benchmark wrappers: the repository root as the working
# directory, ./.venv with the compat-test requirements, a release tessera
# (unless TESSERA_BIN is set), and bench-results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -c 'import confluent_kafka' 2>/dev/null ||
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r compat-tests/python/requirements.txt
if [ -z "${TESSERA_BIN:-}" ]; then
    echo "==> cargo build --release -p tessera-gateway" >&2
    cargo build --release -p tessera-gateway >&2
    export TESSERA_BIN="$ROOT/target/release/tessera"
fi
mkdir -p bench-results
