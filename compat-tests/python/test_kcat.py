"""kcat (Debian's kcat 1.7.1 on librdkafka 2.0.2) against the broker."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from helpers import create_topic, unique_topic

KCAT = os.environ.get("KCAT") or shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test.sh installs it)")

N_LINES = 10_000


def kcat(broker, *args, stdin: bytes | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    cmd = [KCAT, "-b", broker.bootstrap, *args]
    p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {p.returncode}\nstderr:\n{p.stderr.decode(errors='replace')[-4000:]}"
        )
    return p


def test_kcat_metadata_lists_broker(broker):
    out = kcat(broker, "-L").stdout.decode()
    print(out)
    addresses = broker.bootstrap.split(",")
    assert f"{len(addresses)} brokers:" in out, out
    assert all(f"at {a}" in out for a in addresses), out


def test_kcat_metadata_json(broker):
    import json

    topic = unique_topic("kcat-json")
    create_topic(broker, topic, partitions=2)
    md = json.loads(kcat(broker, "-L", "-J", "-t", topic).stdout)
    assert sorted(b["name"] for b in md["brokers"]) == sorted(broker.bootstrap.split(",")), md
    [t] = md["topics"]
    assert t["topic"] == topic
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1]


def _lines(prefix: str) -> list[bytes]:
    return [f"{prefix} line {i:05d} {'x' * (i % 97)}".encode() for i in range(N_LINES)]


def test_kcat_produce_consume_10k_lines(broker):
    topic = unique_topic("kcat")
    create_topic(broker, topic, partitions=1)
    lines = _lines(topic)
    kcat(broker, "-P", "-t", topic, stdin=b"\n".join(lines) + b"\n")
    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-q").stdout
    got = out.split(b"\n")
    assert got[-1] == b""
    got = got[:-1]
    assert len(got) == N_LINES, f"consumed {len(got)} lines, produced {N_LINES}"
    assert got == lines


def test_kcat_produce_autocreates_topic(broker):
    """Kafka's default auto.create.topics.enable=true: kcat -P to a new topic works."""
    topic = unique_topic("kcat-auto")
    lines = _lines(topic)[:1000]
    kcat(broker, "-P", "-t", topic, stdin=b"\n".join(lines) + b"\n")
    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-q").stdout
    got = out.split(b"\n")[:-1]
    assert sorted(got) == sorted(lines)


def test_kcat_keys_and_offsets(broker):
    topic = unique_topic("kcat-keys")
    create_topic(broker, topic, partitions=1)
    payload = b"".join(f"k{i}:v{i}\n".encode() for i in range(100))
    kcat(broker, "-P", "-t", topic, "-K", ":", "-p", "0", stdin=payload)
    out = kcat(
        broker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q", "-f", "%o %k %s\n"
    ).stdout.decode()
    got = out.splitlines()
    assert got == [f"{i} k{i} v{i}" for i in range(100)]
