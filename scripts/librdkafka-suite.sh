#!/usr/bin/env bash
# librdkafka's own integration tests against `tessera cluster --nodes 3`
# (issue 24), run by hand: CI cannot fetch librdkafka's source (no network
# but package registries), so this is not a CI stage.
#
#   ./scripts/librdkafka-suite.sh LIBRDKAFKA_SRC [TESTS] [-- extra tessera -o overrides]
#
# LIBRDKAFKA_SRC: an unpacked librdkafka source tree (v2.15.0 is what the
# figures in docs/ were taken with), e.g. `git archive v2.15.0` of
# github.com/confluentinc/librdkafka. TESTS: librdkafka's TESTS variable
# (e.g. "0081,0113"; default: every test that needs a broker). SUBTESTS
# in the environment picks sub-tests, as librdkafka's runner does.
#
# The cluster runs the way upstream runs its suite: three brokers,
# num.partitions=4, auto-create on, Kafka's other defaults (the tests
# count rebalances that group.initial.rebalance.delay.ms=3000 makes one), and an authorizer with
# allow.everyone.if.no.acl.found=true so the ACL tests run. Add
# `-- -o auto.create.topics.enable=false` for the auto-create-off group
# (upstream's `noautocreate` scenario: the runner then runs only the tests
# marked for it, as librdkafka's `make` does for each of its SCENARIOS).
#
# Tests that shell out to Kafka's tools (`$KAFKA_PATH/bin/kafka-topics.sh`,
# `kafka-acls.sh`: 0052, 0077, 0109, 0115, 0119) get scripts/kafka-tools,
# the same commands over the Kafka protocol (no JVM here).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
src=${1:?usage: $0 LIBRDKAFKA_SRC [TESTS] [-- -o key=value ...]}
src=$(cd "$src" && pwd)
shift
tests=${1:-}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
extra=("$@")

if [ ! -x "$src/tests/test-runner" ]; then
    echo "==> building librdkafka and its test-runner in $src"
    (cd "$src" && ./configure --disable-gssapi --disable-curl >/dev/null \
        && make -j"$(nproc)" libs >/dev/null && make -C tests -j"$(nproc)" build >/dev/null)
fi
bin=${TESSERA_BIN:-$ROOT/target/release/tessera}
[ -x "$bin" ] || cargo build --release -p tessera-gateway

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=$((20000 + RANDOM % 20000))
until port_free $base && port_free $((base + 1)) && port_free $((base + 2)); do base=$((base + 3)); done
work=$(mktemp -d /tmp/tessera-librdkafka-XXXXXX)
"$bin" -o num.partitions=4 \
    -o authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer \
    -o allow.everyone.if.no.acl.found=true "${extra[@]}" \
    cluster --nodes 3 --base-port $base --admin-base-port $((base + 100)) \
    --controller-base-port $((base + 200)) --dir "$work/data" >"$work/cluster.log" 2>&1 &
cluster=$!
trap 'kill $cluster 2>/dev/null; wait $cluster 2>/dev/null || true' EXIT
for _ in $(seq 120); do
    ready=0
    for i in 0 1 2; do
        curl -sf -o /dev/null "http://127.0.0.1:$((base + 100 + i))/ready" && ready=$((ready + 1))
    done
    [ $ready -eq 3 ] && break
    sleep 1
done
echo "==> cluster on 127.0.0.1:$base-$((base + 2)), logs in $work/cluster.log"
printf 'bootstrap.servers=127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d\n' \
    $base $((base + 1)) $((base + 2)) >"$src/tests/test.conf"
scenario=default
for o in "${extra[@]}"; do
    [ "$o" = auto.create.topics.enable=false ] && scenario=noautocreate
done
cd "$src/tests"
export LD_LIBRARY_PATH=../src:../src-cpp
export KAFKA_PATH="$ROOT/scripts/kafka-tools"
export BROKERS="127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))"
export TEST_SCENARIO=${TEST_SCENARIO:-$scenario}
[ -x "$ROOT/.venv/bin/python" ] || { echo "scripts/kafka-tools needs the venv: run ./scripts/test.sh once (or set TESSERA_PYTHON)" >&2; exit 1; }
TEST_KAFKA_VERSION=${TEST_KAFKA_VERSION:-3.9.0} TESTS=$tests ./test-runner -p2
