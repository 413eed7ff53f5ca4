"""Client quotas through real clients.

The admin side (AlterClientQuotas / DescribeClientQuotas) goes through
kafka-python's KafkaAdminClient connection with its own protocol classes:
neither the installed confluent-kafka (2.16) nor kafka-python (3.0) has
``alter_client_quotas`` / ``describe_client_quotas`` helpers. The data side
uses confluent-kafka (librdkafka): a producer whose client.id is limited to
200 KB/s sends 3 MB (the first ~2 MB fit the 10 s quota window, the rest is
throttled), and a consumer likewise; the broker's quota metrics and
librdkafka's own throttle statistics (``stats_cb`` -> brokers.*.throttle)
both show the throttling."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
)

from helpers import create_topic, unique_topic

RATE = 200 * 1024
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


@pytest.fixture(autouse=True)
def _tessera_only(broker):
    if not broker.has_admin_http:
        pytest.skip("needs the broker's /metrics")


def send(broker, request):
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="quota-admin")
    try:
        async def go():
            return await a._manager.send(request)

        return a._manager.run(go)
    finally:
        a.close()


def alter(broker, entries, validate_only=False):
    """entries: [([(type, name|None)], [(key, value|None)])] -> [error codes]."""
    E = AlterClientQuotasRequest.EntryData
    req = AlterClientQuotasRequest(
        entries=[
            E(
                entity=[E.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                ops=[
                    E.OpData(key=k, value=0.0 if v is None else float(v), remove=v is None)
                    for k, v in ops
                ],
            )
            for entity, ops in entries
        ],
        validate_only=validate_only,
    )
    return [e.error_code for e in send(broker, req).entries]


def describe(broker, components, strict=False):
    """components: [(type, match_type, match)] -> ({entity: {key: value}}, error code)."""
    C = DescribeClientQuotasRequest.ComponentData
    req = DescribeClientQuotasRequest(
        components=[C(entity_type=t, match_type=m, match=s) for t, m, s in components],
        strict=strict,
    )
    resp = send(broker, req)
    if resp.error_code:
        return None, resp.error_code
    out = {}
    for e in resp.entries or []:
        name = "|".join(f"{d.entity_type}={d.entity_name or '<default>'}" for d in e.entity)
        out[name] = {v.key: v.value for v in e.values}
    return out, 0


def metric(broker, name, kind, client_id):
    with urllib.request.urlopen(broker.admin_url("/metrics"), timeout=10) as r:
        text = r.read().decode()
    total = 0
    pat = re.compile(
        rf'^{name}{{kind="{kind}",user="[^"]*",client_id="{re.escape(client_id)}"}} (\d+)$'
    )
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            total += int(m.group(1))
    return total


def test_alter_and_describe(broker):
    assert alter(broker, [([("client-id", "app")], [("producer_byte_rate", 1024)])], validate_only=True) == [0]
    assert describe(broker, []) == ({}, 0)
    assert alter(
        broker,
        [
            ([("client-id", "app")], [("producer_byte_rate", 1024)]),
            ([("user", "alice"), ("client-id", None)], [("consumer_byte_rate", 2048), ("request_percentage", 50)]),
            ([("user", None)], [("producer_byte_rate", 4096)]),
            ([("user", "bob")], [("producer_byte_rate", 1.5)]),  # a LONG config
            ([("user", "bob")], [("bogus_rate", 1)]),
            ([], [("producer_byte_rate", 1)]),
        ],
    ) == [0, 0, 0, 42, 42, 42]
    everything, err = describe(broker, [])
    assert err == 0
    assert everything == {
        "client-id=app": {"producer_byte_rate": 1024.0},
        "user=alice|client-id=<default>": {"consumer_byte_rate": 2048.0, "request_percentage": 50.0},
        "user=<default>": {"producer_byte_rate": 4096.0},
    }
    assert describe(broker, [("user", MATCH_EXACT, "alice")])[0] == {
        "user=alice|client-id=<default>": {"consumer_byte_rate": 2048.0, "request_percentage": 50.0},
    }
    assert describe(broker, [("user", MATCH_EXACT, "alice")], strict=True)[0] == {}
    assert describe(broker, [("user", MATCH_DEFAULT, None)], strict=True)[0] == {
        "user=<default>": {"producer_byte_rate": 4096.0},
    }
    assert set(describe(broker, [("user", MATCH_SPECIFIED, None)])[0]) == {
        "user=alice|client-id=<default>",
        "user=<default>",
    }
    assert describe(broker, [("user", MATCH_EXACT, None)]) == (None, 42)
    # Removal.
    assert alter(broker, [([("user", None)], [("producer_byte_rate", None)])]) == [0]
    assert "user=<default>" not in describe(broker, [])[0]


def stats_throttle(stats_json: str) -> int:
    s = json.loads(stats_json)
    return max(
        (b.get("throttle", {}).get("max", 0) for b in s.get("brokers", {}).values()),
        default=0,
    )


def test_producer_and_consumer_throttled(broker):
    topic = unique_topic("quota")
    create_topic(broker, topic)
    assert alter(broker, [([("client-id", "quota-producer")], [("producer_byte_rate", RATE)])]) == [0]
    assert alter(broker, [([("client-id", "quota-consumer")], [("consumer_byte_rate", RATE)])]) == [0]

    throttles = []
    p = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "client.id": "quota-producer",
            "linger.ms": 5,
            "batch.size": 64 * 1024,
            "statistics.interval.ms": 500,
            "stats_cb": lambda s: throttles.append(stats_throttle(s)),
            "throttle_cb": lambda e: throttles.append(e.throttle_time * 1000),
        }
    )
    value = b"x" * 1024
    total = 3 * 1024 * 1024
    started = time.monotonic()
    for i in range(total // len(value)):
        while True:
            try:
                p.produce(topic, value, key=str(i).encode())
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(120) == 0
    produce_s = time.monotonic() - started
    p.poll(1.5)  # one more stats interval

    counted = metric(broker, "tessera_quota_bytes_total", "produce", "quota-producer")
    throttled = metric(broker, "tessera_quota_throttled_total", "produce", "quota-producer")
    throttle_ms = metric(broker, "tessera_quota_throttle_time_ms_total", "produce", "quota-producer")
    assert counted >= total, counted
    assert throttled > 0 and throttle_ms > 0
    # librdkafka saw throttle_time_ms in the responses.
    assert max(throttles, default=0) > 0, throttles
    # The quota's contract, a ceiling on the rate: no more than the bound
    # per second of the run plus one full window's allowance (11 x 1 s
    # samples, Kafka's default) was accepted. Noise only slows a run, so
    # this cannot fail on a busy machine; only a broker that let too much
    # through fails it.
    allowed = RATE * (produce_s + 11)
    assert total <= allowed, f"{total} B accepted in {produce_s:.1f} s, quota allows {allowed:.0f}"

    got = 0
    c_throttles = []
    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "client.id": "quota-consumer",
            "group.id": unique_topic("quota-g"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "statistics.interval.ms": 500,
            "stats_cb": lambda s: c_throttles.append(stats_throttle(s)),
            "throttle_cb": lambda e: c_throttles.append(e.throttle_time * 1000),
        }
    )
    c.subscribe([topic])
    started = time.monotonic()
    try:
        while got < total and time.monotonic() - started < 120:
            for m in c.consume(500, timeout=1.0):
                if m.error() is None:
                    got += len(m.value())
        c.poll(1.5)
    finally:
        c.close()
    assert got >= total
    fetched = metric(broker, "tessera_quota_bytes_total", "fetch", "quota-consumer")
    assert fetched >= total, fetched
    assert metric(broker, "tessera_quota_throttled_total", "fetch", "quota-consumer") > 0
    assert max(c_throttles, default=0) > 0, c_throttles
