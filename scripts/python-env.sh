# Sourced by scripts/test.sh and scripts/faults.sh: the Python venv at
# $ROOT/.venv with compat-tests/python/requirements.txt, made and updated
# idempotently (reinstalled only when requirements.txt changed). Needs ROOT,
# step and as_root from the sourcing script; sets VENV.
VENV="$ROOT/.venv"
REQS="$ROOT/compat-tests/python/requirements.txt"

ensure_venv() {
    local py=${PYTHON:-}
    if [ -z "$py" ]; then
        for c in python3.11 python3; do
            if command -v "$c" >/dev/null 2>&1; then py=$c; break; fi
        done
    fi
    [ -n "$py" ] || { echo "python3 not found" >&2; return 1; }
    if [ ! -x "$VENV/bin/python" ]; then
        step "creating venv at $VENV"
        if ! "$py" -m venv "$VENV"; then
            # Debian's python needs the venv module from its own package
            rm -rf "$VENV"
            local ver
            ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
            as_root apt-get update
            as_root apt-get install -y "python${ver}-venv" || \
                as_root apt-get install -y python3-venv
            "$py" -m venv "$VENV"
        fi
    fi
    local stamp="$VENV/.compat-requirements.sha256" want
    want=$(sha256sum "$REQS" | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        step "installing python packages into $VENV"
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQS"
        echo "$want" > "$stamp"
    fi
}
