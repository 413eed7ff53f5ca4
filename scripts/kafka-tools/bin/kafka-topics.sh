#!/usr/bin/env bash
# Kafka's kafka-topics.sh, as far as ../kafka_tools.py implements it.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=$(cd "$here/../.." && pwd)
exec "${TESSERA_PYTHON:-$root/.venv/bin/python}" "$here/kafka_tools.py" topics "$@"
