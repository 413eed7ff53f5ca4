"""Small shared helpers for the compatibility tests (confluent-kafka based)."""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import uuid

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic


def uvarint(n: int) -> bytes:
    """Kafka's unsigned varint (compact lengths, tagged-field counts)."""
    out = b""
    while n >= 0x80:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def admin(broker, **extra) -> AdminClient:
    conf = {"bootstrap.servers": broker.bootstrap}
    conf.update(extra)
    return AdminClient(conf)


def create_topic(broker, name: str, partitions: int = 1, config: dict | None = None,
                 timeout: float = 60.0) -> None:
    """Create a topic with the confluent-kafka AdminClient and wait until the
    broker's metadata shows every partition with a leader."""
    a = admin(broker)
    fs = a.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    fs[name].result(timeout=timeout)
    wait_topic(a, name, partitions, timeout)


def wait_topic(a: AdminClient, name: str, partitions: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            md = a.list_topics(topic=name, timeout=10)
            t = md.topics.get(name)
            if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()
            ):
                return md
            last = t.error if t is not None else "missing"
        except KafkaException as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"topic {name} not ready with {partitions} partitions: {last}")


def topic_names(a: AdminClient) -> set[str]:
    return set(a.list_topics(timeout=10).topics)


def broker_metric(broker, name: str) -> float:
    """The sum of a Prometheus counter's samples on a tessera's /metrics."""
    import urllib.request

    with urllib.request.urlopen(broker.admin_url("/metrics"), timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def sasl_conf(b, mechanism: str, user: str, password: str, **extra) -> dict:
    """confluent-kafka settings for `b`'s SASL_PLAINTEXT listener."""
    return {
        "bootstrap.servers": b.sasl_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        **extra,
    }


def kafka_python_sasl_conf(b, mechanism: str, user: str, password: str) -> dict:
    """kafka-python settings for `b`'s SASL_PLAINTEXT listener."""
    return {
        "bootstrap_servers": b.sasl_bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def poll_until_idle(consumer, idle: int):
    """The messages `consumer` polls until `idle` polls of one second in a
    row return nothing; the caller closes the consumer. A message error
    other than end-of-partition raises."""
    quiet = 0
    while quiet < idle:
        m = consumer.poll(1.0)
        if m is None:
            quiet += 1
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(m.error())
        quiet = 0
        yield m


def consume_values(conf: dict, topic: str, n: int, timeout: float = 60) -> list[bytes]:
    """Up to `n` values read from the start of `topic` by a new
    confluent-kafka group member with `conf`; any message error fails."""
    from confluent_kafka import Consumer

    c = Consumer(dict(conf, **{"group.id": unique_topic("g"), "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = []
    try:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m.value())
    finally:
        c.close()
    return got


class Acks:
    """A producer's delivery callback: acknowledged (topic, partition,
    offset) -> value, and the errors reported."""

    def __init__(self):
        self.acked: dict[tuple[str, int, int], bytes] = {}
        self.errors: list = []
        self.lock = threading.Lock()

    def __call__(self, err, msg):
        with self.lock:
            if err is not None:
                self.errors.append(err)
            else:
                self.acked[(msg.topic(), msg.partition(), msg.offset())] = msg.value()

    def of(self, topic: str) -> dict[tuple[int, int], bytes]:
        """(partition, offset) -> value acknowledged on `topic`."""
        with self.lock:
            return {(p, o): v for (t, p, o), v in self.acked.items() if t == topic}


def read_back(conf: dict, topic: str, partitions: int, timeout: float = 60,
              **extra) -> dict[tuple[int, int], bytes]:
    """Every record of `topic` from offset 0 to each partition's end (the
    last stable offset under read_committed) as (partition, offset) ->
    value, read by an assigned confluent-kafka consumer with `conf` (and
    `extra` settings). Any message error but end-of-partition fails, and so
    does a record read twice or a partition whose end is not reached."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(dict(conf, **{"group.id": unique_topic("read-back"), "enable.auto.commit": False,
                               "enable.partition.eof": True}, **extra))
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[tuple[int, int], bytes] = {}
    at_end: set[int] = set()
    try:
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(at_end)} of {partitions} read to the end"
            for m in c.consume(500, timeout=0.5):
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    at_end.add(m.partition())
                    continue
                k = (m.partition(), m.offset())
                assert k not in got, f"{topic}: offset {k} read twice"
                got[k] = m.value()
                at_end.discard(m.partition())
    finally:
        c.close()
    return got


def admin_ready(admin_url: str) -> bool:
    """A tessera's admin listener at `admin_url` answers GET /ready with 200."""
    try:
        with urllib.request.urlopen(admin_url + "/ready", timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


class Worker(threading.Thread):
    """A daemon thread running `target()`: `result()` in the test's thread
    waits for it and returns what it returned or raises what it raised, so
    an assertion failing in the thread fails the test."""

    def __init__(self, target, name: str | None = None):
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self._value = None
        self._error: BaseException | None = None

    def run(self):
        try:
            self._value = self._target_fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by result()
            self._error = e

    def result(self, timeout: float):
        self.join(timeout)
        assert not self.is_alive(), f"thread {self.name} still running after {timeout} s"
        if self._error is not None:
            raise self._error
        return self._value


# --- hand-built requests (APIs no Python client has) ------------------------

class Reader:
    """A cursor over a response body (big-endian, Kafka varints)."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        values = struct.unpack(fmt, self.data[self.at:self.at + size])
        self.at += size
        return values[0] if len(values) == 1 else values

    def uvarint(self) -> int:
        n, shift = 0, 0
        while True:
            b = self.data[self.at]
            self.at += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n
            shift += 7

    def compact_string(self) -> str | None:
        n = self.uvarint()
        if n == 0:
            return None
        s = self.data[self.at:self.at + n - 1].decode()
        self.at += n - 1
        return s

    def tagged_fields(self):
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            size = self.uvarint()  # read before `self.at` is (`x += f()` loads x first)
            self.at += size


def recv_exact(s: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes from `s` (a closed connection fails the test)."""
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


def flexible_request(bootstrap: str, api_key: int, version: int, body: bytes) -> Reader:
    """One request with header v2 (client id "t"); the response body after
    header v1."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        msg = struct.pack(">hhih", api_key, version, 7, 1) + b"t" + uvarint(0) + body
        s.sendall(struct.pack(">i", len(msg)) + msg)

        size = struct.unpack(">i", recv_exact(s, 4))[0]
        r = Reader(recv_exact(s, size))
    assert r.take(">i") == 7
    r.tagged_fields()
    return r


def consumer_group_epochs(bootstrap: str, group: str) -> tuple[int, dict[str, int]]:
    """ConsumerGroupDescribe v0 (KIP-848) of `group`: its group epoch and
    each member's epoch by member id (no Python client exposes them)."""

    def compact(s: str) -> bytes:
        return uvarint(len(s) + 1) + s.encode()

    # On a cluster (comma-separated addresses) only the group's coordinator
    # answers; the others say NOT_COORDINATOR (16).
    for address in bootstrap.split(","):
        r = flexible_request(address, 69, 0, uvarint(2) + compact(group) + b"\x00" + uvarint(0))
        r.take(">i")  # throttle
        assert r.uvarint() == 2, "one group described"
        error = r.take(">h")
        message = r.compact_string()
        if error != 16:
            break
    assert error == 0, (error, message)
    assert r.compact_string() == group
    r.compact_string()  # state
    group_epoch, _assignment_epoch = r.take(">ii")
    r.compact_string()  # assignor

    def assignment():
        for _ in range(r.uvarint() - 1):
            r.at += 16  # topic id
            r.compact_string()
            partitions = r.uvarint() - 1
            r.at += 4 * partitions
            r.tagged_fields()
        r.tagged_fields()

    members = {}
    for _ in range(r.uvarint() - 1):
        member_id = r.compact_string()
        r.compact_string()  # instance id
        r.compact_string()  # rack
        members[member_id] = r.take(">i")
        r.compact_string()  # client id
        r.compact_string()  # client host
        for _ in range(r.uvarint() - 1):
            r.compact_string()  # subscribed topic names
        r.compact_string()  # subscribed regex
        assignment()
        assignment()  # target assignment
        r.tagged_fields()
    r.take(">i")  # authorized operations
    r.tagged_fields()  # the group's
    r.tagged_fields()  # the response's
    assert r.at == len(r.data), "ConsumerGroupDescribe parsed to its end"
    return group_epoch, members


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def broker_log_lines(broker, *needles: str) -> list[str]:
    """The lines of a broker's log (colour codes removed) that contain any of
    `needles`: how a test sees an event only the broker knows of."""
    try:
        text = ANSI.sub("", broker.log_path.read_text(errors="replace"))
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if any(n in line for n in needles)]
