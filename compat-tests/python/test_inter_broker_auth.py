"""Who may talk to a broker as a broker (issue 26, security).

* The replication stream (a connection upgraded with the private api key
  0x7e01, then `Read` / `Fence` / `ReadSnapshot` / `Hello` frames, built
  by hand here as an attacker would): on a single node whose only
  listener is SASL_PLAINTEXT, with an authorizer and a super user, a
  client without credentials, and an authenticated user without
  CLUSTER_ACTION, get nothing back (the connection is closed, no stored
  batch byte) and fence nothing (an authenticated producer keeps
  producing, every record read back at its offset); the upgrade on a
  listener that is not the inter-broker one is refused even to a super
  user, who is served on the inter-broker listener (the positive control:
  the same frames do return the stored records there).
* A 3-node cluster whose inter-broker listener and controller listener are
  SASL_PLAINTEXT (PLAIN), or SSL with client certificates required (the
  brokers' principal in super.users either way): RF=3
  acks=all produce while the leader is killed with SIGKILL, every
  acknowledged record read back once at its offset; hand-built quorum
  transport frames (Vote, ReadIndex, JoinAsLearner) from an unauthenticated
  peer get no answer and change nothing.
* ACLs on the inter-broker listener (librdkafka's 0115/0119/0109): on a
  one-listener node with `allow.everyone.if.no.acl.found=true`, a DENY
  for User:* on a topic stops produce, fetch and auto-creation, while the
  broker principal (a super user) still produces and reads back.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

import procguard
from conftest import free_port, tessera_bin
from helpers import broker_metric, sasl_conf, unique_topic
from test_cluster import CLUSTER_DEFAULTS, eventually, free_block
from tls_setup import make_certs, needs_openssl

PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule required "
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

UPGRADE_API_KEY = 0x7E01
# replication/src/protocol.rs message kinds
HELLO, APPEND, REFUSED, FENCE, READ, DATA, READ_SNAPSHOT = 1, 2, 5, 6, 8, 9, 10


def skip_unless_tessera():
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's private replication protocol")


# ---- hand-built frames ---------------------------------------------------

def upgrade_request() -> bytes:
    """The Kafka request that turns a connection into a replication stream
    (header v1: api key, version 0, correlation id 0, null client id)."""
    body = struct.pack(">hhih", UPGRADE_API_KEY, 0, 0, -1)
    return struct.pack(">i", len(body)) + body


def repl_frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">IB", len(payload) + 1, kind) + payload


def read_frame(range_id: int, seq: int = 0, epoch: int = 0) -> bytes:
    # segment (range u64, seq u32), from u64, max u32, cleaning pass u64,
    # the segment's leader epoch i32 (replication/src/protocol.rs `Read`)
    return repl_frame(READ, struct.pack(">QIQIQi", range_id, seq, 0, 4 << 20, 0, epoch))


def fence_frame(range_id: int, seq: int = 0, epoch: int = 0) -> bytes:
    return repl_frame(FENCE, struct.pack(">QIi", range_id, seq, epoch))


def read_snapshot_frame(range_id: int, seq: int = 0) -> bytes:
    return repl_frame(READ_SNAPSHOT, struct.pack(">QI", range_id, seq))


def hello_frame(from_broker: int) -> bytes:
    return repl_frame(HELLO, struct.pack(">i", from_broker))


def kafka_request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    client = b"attacker"
    header = struct.pack(">hhih", api_key, version, correlation, len(client)) + client
    return struct.pack(">i", len(header) + len(body)) + header + body


def recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def kafka_response(s: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(s, 4))
    return recv_exact(s, size)[4:]  # without the correlation id


def sasl_plain_login(s: socket.socket, user: str, password: str):
    """SaslHandshake v1 (PLAIN) and SaslAuthenticate v1, by hand."""
    mech = b"PLAIN"
    s.sendall(kafka_request(17, 1, 1, struct.pack(">h", len(mech)) + mech))
    (error,) = struct.unpack(">h", kafka_response(s)[:2])
    assert error == 0, f"SaslHandshake error {error}"
    token = b"\0" + user.encode() + b"\0" + password.encode()
    s.sendall(kafka_request(36, 1, 2, struct.pack(">i", len(token)) + token))
    (error,) = struct.unpack(">h", kafka_response(s)[:2])
    assert error == 0, f"SaslAuthenticate error {error} for {user}"


def drain(s: socket.socket, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Everything the server sends until it closes the connection or goes
    quiet for `timeout`: (bytes, closed)."""
    s.settimeout(timeout)
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return got, False
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += chunk


def attempt(addr: tuple[str, int], frames: bytes, login: tuple[str, str] | None = None,
            quiet: float = 10.0) -> tuple[bytes, bool]:
    """One connection: optionally SASL PLAIN, then the upgrade and
    `frames`; what came back and whether the server closed it."""
    with socket.create_connection(addr, timeout=10) as s:
        if login:
            sasl_plain_login(s, *login)
        try:
            s.sendall(upgrade_request() + frames)
        except (BrokenPipeError, ConnectionResetError):
            return b"", True
        return drain(s, quiet)


def replication_replies(data: bytes) -> list[tuple[int, bytes]]:
    """The replication frames in `data`: (kind, payload)."""
    out = []
    while len(data) >= 5:
        (n,) = struct.unpack(">I", data[:4])
        if len(data) < 4 + n or n == 0:
            break
        out.append((data[4], data[5:4 + n]))
        data = data[4 + n:]
    return out


# ---- a single node: SASL_PLAINTEXT only, authorizer, a super user ---------

USERS = 'user_admin="admin-secret" user_alice="alice-secret"'


@pytest.fixture
def sasl_only(broker_factory):
    """The issue's node: one listener, SASL_PLAINTEXT (PLAIN), the
    authorizer, `admin` a super user, `alice` not."""
    skip_unless_tessera()
    b = broker_factory(start=False)
    b.overrides.update({
        "listeners": f"SASL_PLAINTEXT://{b.host}:{b.port}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN + USERS + ";",
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin",
    })
    b.start()
    b.sasl_bootstrap = b.bootstrap
    return b


def produce(conf: dict, topic: str, values: list[bytes]) -> list[int]:
    """acks=all; the offsets the broker acknowledged, in order."""
    offsets, errors = [], []

    def done(err, msg):
        (errors if err else offsets).append(err or msg.offset())

    p = Producer(dict(conf, acks="all", **{"message.timeout.ms": 20000}))
    for v in values:
        p.produce(topic, v, on_delivery=done)
    assert p.flush(30) == 0
    assert errors == [], errors
    return offsets


def read_back(conf: dict, topic: str, n: int) -> list[tuple[int, bytes]]:
    c = Consumer(dict(conf, **{"group.id": unique_topic("g"), "auto.offset.reset": "earliest",
                               "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, 0, 0)])
    got, deadline = [], time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append((m.offset(), m.value()))
    c.close()
    return got


def test_unauthenticated_and_unauthorized_replication_streams_get_nothing(sasl_only):
    b = sasl_only
    admin = sasl_conf(b, "PLAIN", "admin", "admin-secret")
    topic = unique_topic("secret")
    a = AdminClient(admin)
    a.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    first = [f"secret-{i:03d}".encode() for i in range(50)]
    assert produce(admin, topic, first) == list(range(50))
    ranges = list(range(64))
    refused_before = broker_metric(b, "tessera_replication_upgrades_refused_total")

    attempts = 0
    for login in (None, ("alice", "alice-secret")):
        for r in ranges:
            for frames in (read_frame(r), read_snapshot_frame(r), fence_frame(r),
                           hello_frame(1) + fence_frame(r)):
                got, closed = attempt((b.host, b.port), frames, login, quiet=5.0)
                attempts += 1
                assert b"secret-" not in got, (login, r, got[:200])
                assert got == b"", (login, r, got[:200])
                assert closed, (login, r)

    # Every attempt was refused at the upgrade, counted once each.
    refused = broker_metric(b, "tessera_replication_upgrades_refused_total") - refused_before
    assert refused == attempts

    # Nothing was fenced: the authenticated producer goes on, every record
    # is read back at its offset.
    more = [f"after-{i:03d}".encode() for i in range(20)]
    assert produce(admin, topic, more) == list(range(50, 70))
    assert read_back(admin, topic, 70) == list(enumerate(first + more))


@pytest.fixture
def two_listeners(broker_factory):
    """BROKER (the inter-broker listener) and CLIENT, both SASL_PLAINTEXT."""
    skip_unless_tessera()
    b = broker_factory(start=False)
    b.client_port = free_port()
    jaas = PLAIN + USERS + ";"
    b.overrides.update({
        "listeners": f"BROKER://{b.host}:{b.port},CLIENT://{b.host}:{b.client_port}",
        "listener.security.protocol.map": "BROKER:SASL_PLAINTEXT,CLIENT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "BROKER",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.broker.plain.sasl.jaas.config": jaas,
        "listener.name.client.plain.sasl.jaas.config": jaas,
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin",
    })
    b.start()
    b.sasl_bootstrap = f"{b.host}:{b.client_port}"
    return b


def test_upgrade_only_on_the_inter_broker_listener(two_listeners):
    b = two_listeners
    admin = sasl_conf(b, "PLAIN", "admin", "admin-secret")
    topic = unique_topic("kept")
    a = AdminClient(admin)
    a.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert produce(admin, topic, [b"kept-value"] * 5) == list(range(5))

    # On the client listener: refused, without credentials and to the
    # super user alike.
    for login in (None, ("admin", "admin-secret")):
        for r in range(64):
            got, closed = attempt((b.host, b.client_port), read_frame(r), login, quiet=5.0)
            assert (got, closed) == (b"", True), (login, r, got[:200])

    # The same frames on the inter-broker listener, as the super user (a
    # broker's principal): served. The stored batches come back.
    served = []
    for r in range(64):
        got, closed = attempt((b.host, b.port), read_frame(r), ("admin", "admin-secret"),
                              quiet=5.0)
        served += replication_replies(got)
    data = [p for kind, p in served if kind == DATA]
    assert any(b"kept-value" in p for p in data), served[:5]

    # A stream's Hello must name a registered broker: from broker 1 an
    # append for a segment it is no primary of is refused in-stream; from
    # "broker 99" the stream is closed before any append is looked at.
    append = repl_frame(APPEND, struct.pack(">QIiQ", 1 << 40, 0, 0, 0) + b"x")
    got, closed = attempt((b.host, b.port), hello_frame(1) + append, ("admin", "admin-secret"),
                          quiet=5.0)
    assert [kind for kind, _ in replication_replies(got)] == [REFUSED], got[:200]
    got, closed = attempt((b.host, b.port), hello_frame(99) + append, ("admin", "admin-secret"),
                          quiet=5.0)
    assert (got, closed) == (b"", True), got[:200]


# ---- ACLs on the inter-broker listener (librdkafka 0115 / 0119 / 0109) ----

def test_deny_acl_for_everyone_holds_on_the_only_listener(broker_factory):
    skip_unless_tessera()
    b = broker_factory(start=False)
    b.overrides.update({
        "listeners": f"SASL_PLAINTEXT://{b.host}:{b.port}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN + USERS + ";",
        "authorizer.class.name": AUTHORIZER,
        "allow.everyone.if.no.acl.found": "true",
        # The broker's own principal, as a Kafka operator names it.
        "super.users": "User:admin",
    })
    b.start()
    b.sasl_bootstrap = b.bootstrap
    admin = sasl_conf(b, "PLAIN", "admin", "admin-secret")
    alice = sasl_conf(b, "PLAIN", "alice", "alice-secret")
    topic, auto = unique_topic("denied"), unique_topic("auto-denied")
    a = AdminClient(admin)
    a.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert produce(alice, topic, [b"before-deny"]) == [0]  # no ACL yet: allowed
    deny = [AclBinding(ResourceType.TOPIC, t, ResourcePatternType.LITERAL, "User:*", "*",
                       AclOperation.ALL, AclPermissionType.DENY) for t in (topic, auto)]
    for f in a.create_acls(deny, request_timeout=30).values():
        f.result(30)

    # 0115: produce is refused.
    errors = []
    p = Producer(dict(alice, acks="all", **{"message.timeout.ms": 10000}))
    p.produce(topic, b"denied", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert [e.code() for e in errors if e] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], errors

    # 0119: fetch is refused: nothing is delivered, and the broker denied
    # the consumer's requests for the topic.
    denied_before = broker_metric(b, "tessera_authorization_denied_total")
    c = Consumer(dict(alice, **{"group.id": unique_topic("g"), "auto.offset.reset": "earliest"}))
    c.assign([TopicPartition(topic, 0, 0)])
    seen, deadline = [], time.monotonic() + 15
    while time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None:
            seen.append(m.error().code() if m.error() else m.value())
    c.close()
    assert b"before-deny" not in seen, seen
    assert broker_metric(b, "tessera_authorization_denied_total") > denied_before

    # 0109: auto-creation is refused, and the topic does not exist.
    errors = []
    p = Producer(dict(alice, acks="all", **{"message.timeout.ms": 10000}))
    p.produce(auto, b"x", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None, errors
    assert auto not in a.list_topics(timeout=20).topics

    # The broker principal (a super user) is not denied.
    assert produce(admin, topic, [b"by-admin"]) == [1]
    assert read_back(admin, topic, 2) == [(0, b"before-deny"), (1, b"by-admin")]


# ---- a 3-node cluster with SASL between brokers and on the quorum ---------

BROKER_JAAS = (PLAIN + 'username="broker" password="broker-secret" '
               'user_broker="broker-secret" user_client="client-secret";')


class SecuredCluster:
    """Three controller+broker nodes; every listener, the inter-broker one
    and the controller listener included, SASL_PLAINTEXT (PLAIN, the
    brokers' user `broker` a super user) or SSL with
    `ssl.client.auth=required` (the brokers' certificate's principal a
    super user)."""

    def __init__(self, workdir: Path, protocol: str, nodes: int = 3):
        self.workdir = workdir
        self.protocol = protocol
        self.kafka, self.admin, self.controller = (free_block(nodes), free_block(nodes),
                                                   free_block(nodes))
        self.nodes = nodes
        self.voters = ",".join(f"{i + 1}@127.0.0.1:{self.controller + i}" for i in range(nodes))
        self.procs: dict[int, object] = {}

    def command(self, node: int) -> list[str]:
        i = node - 1
        p = self.protocol
        overrides = {
            **CLUSTER_DEFAULTS,
            "controller.quorum.voters": self.voters,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": f"{p}:{p},CONTROLLER:{p}",
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "true",
        }
        if p == "SASL_PLAINTEXT":
            overrides.update({
                "sasl.enabled.mechanisms": "PLAIN",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "sasl.mechanism.controller.protocol": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": BROKER_JAAS,
                "listener.name.controller.plain.sasl.jaas.config": BROKER_JAAS,
                "super.users": "User:broker",
            })
        else:
            overrides.update({
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.workdir / "keystore.pem"),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.workdir / "ca.pem"),
                "ssl.client.auth": "required",
                # The principal of the brokers' certificate (subject CN=localhost).
                "super.users": "User:CN=localhost",
            })
        return [
            str(tessera_bin()), "--data-dir", str(self.workdir / f"node-{node}"),
            "--node-id", str(node),
            "--listeners", f"{p}://127.0.0.1:{self.kafka + i}",
            "--admin-listener", f"127.0.0.1:{self.admin + i}",
            *[a for k, v in overrides.items() for a in ("-o", f"{k}={v}")],
        ]

    def start(self, node: int):
        log = open(self.workdir / f"node-{node}.log", "ab")
        env = dict(os.environ, RUST_LOG="info")
        self.procs[node] = procguard.spawn(self.command(node), cwd=self.workdir, stdout=log,
                                           stderr=log, env=env)

    def ready(self, node: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin + node - 1}/ready",
                                        timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self, node: int):
        self.procs[node].send_signal(signal.SIGKILL)
        self.procs[node].wait(30)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.kafka + i}" for i in range(self.nodes))

    def conf(self, **extra) -> dict:
        if self.protocol == "SSL":
            return {"bootstrap.servers": self.bootstrap, "security.protocol": "SSL",
                    "ssl.ca.location": str(self.workdir / "ca.pem"),
                    "ssl.certificate.location": str(self.workdir / "client.pem"),
                    "ssl.key.location": str(self.workdir / "client.key"), **extra}
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN", "sasl.username": "client",
                "sasl.password": "client-secret", **extra}


@pytest.fixture(params=["SASL_PLAINTEXT", pytest.param("SSL", marks=needs_openssl)])
def secured_cluster(request, tmp_path):
    skip_unless_tessera()
    if request.param == "SSL":
        make_certs(tmp_path)
    c = SecuredCluster(tmp_path, request.param)
    for n in range(1, c.nodes + 1):
        c.start(n)
    try:
        eventually("every node ready", lambda: all(c.ready(n) for n in range(1, c.nodes + 1)),
                   timeout=90)
        yield c
    finally:
        for p in c.procs.values():
            procguard.kill(p)


def quorum_frame(kind: int, to: int, body: bytes) -> bytes:
    """metadata/src/network.rs: version 1, kind, from node, to node, body."""
    payload = struct.pack(">BBQQ", 1, kind, 99, to) + body
    return struct.pack(">I", len(payload)) + payload


def test_secured_cluster_replicates_and_its_quorum_refuses_strangers(secured_cluster):
    c = secured_cluster
    conf = c.conf()
    topic = "replicated-sasl"
    a = AdminClient(conf)
    a.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})],
                    request_timeout=30)[topic].result(30)
    eventually(f"{topic} has a leader and 3 replicas",
               lambda: (t := a.list_topics(topic, timeout=10).topics.get(topic)) is not None
               and t.error is None and t.partitions[0].leader > 0
               and len(t.partitions[0].replicas) == 3)

    acked: dict[int, bytes] = {}
    errors: list = []

    def done(err, msg):
        if err:
            errors.append(err)
        else:
            acked[msg.offset()] = msg.value()

    p = Producer(dict(conf, acks="all", **{"enable.idempotence": True, "linger.ms": 5,
                                           "message.timeout.ms": 120000}))
    for i in range(200):
        p.produce(topic, f"v{i:04d}".encode(), on_delivery=done)
    assert p.flush(60) == 0
    assert len(acked) == 200 and not errors, errors

    # kill -9 the leader; the survivors (2 of 3: min.insync.replicas) go on.
    leader = a.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    c.kill(leader)
    for i in range(200, 400):
        p.produce(topic, f"v{i:04d}".encode(), on_delivery=done)
    assert p.flush(120) == 0
    assert len(acked) == 400 and not errors, errors

    # Hand-built quorum frames from a peer that does not authenticate: no
    # answer, the connection closed, on every live controller.
    live = [n for n in range(1, c.nodes + 1) if n != leader]
    vote = json.dumps({"vote": {"leader_id": {"term": 1, "node_id": 99}, "committed": False},
                       "last_log_id": None}).encode()
    address = b"127.0.0.1:1"
    for n in live:
        for kind, body in ((2, vote), (5, b""),
                           (7, struct.pack(">QI", 99, len(address)) + address)):
            with socket.create_connection(("127.0.0.1", c.controller + n - 1), timeout=10) as s:
                try:
                    s.sendall(quorum_frame(kind, n, body))
                except (BrokenPipeError, ConnectionResetError):
                    continue
                got, closed = drain(s, 10.0)
                # Nothing, or (SSL) the TLS alert refusing the handshake.
                assert closed and (got == b"" or got[:1] == b"\x15"), (n, kind, got[:200])

    # The cluster's metadata is what it was: no node 99, and every
    # acknowledged record is read back once, at its offset.
    md = a.list_topics(timeout=20)
    assert 99 not in md.brokers, md.brokers
    cons = Consumer(dict(conf, **{"group.id": unique_topic("g"), "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False}))
    cons.assign([TopicPartition(topic, 0, 0)])
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + 90
    while len(got) < len(acked) and time.monotonic() < deadline:
        m = cons.poll(1.0)
        if m is None or m.error():
            continue
        assert m.offset() not in got, f"offset {m.offset()} read twice"
        got[m.offset()] = m.value()
    cons.close()
    assert got == acked
