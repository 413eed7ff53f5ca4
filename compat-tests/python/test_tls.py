"""TLS with real clients: a broker with PLAINTEXT, SSL and SASL_SSL
listeners (PEM keystore and truststore made here with the openssl CLI,
ssl.client.auth=requested). confluent-kafka and kcat over SASL_SSL with
SCRAM, confluent-kafka over SSL with a client certificate (the broker
derives the principal from its DN), a plaintext client on the TLS port
dropped cleanly while everyone else is served, and certificates rotated
without a restart (AlterConfigs of ssl.keystore.location)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import struct
import subprocess

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource

from conftest import free_port
from helpers import Acks, broker_metric, consume_values, create_topic, read_back, unique_topic
from tls_setup import make_certs, needs_openssl, sasl_ssl_conf, ssl_conf, start_tls_broker

KCAT = os.environ.get("KCAT") or shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = needs_openssl


@pytest.fixture
def tls_broker(broker_factory, tmp_path):
    return start_tls_broker(broker_factory, tmp_path)


def roundtrip(b, conf: dict, n: int = 30):
    topic = unique_topic("tls")
    create_topic(b, topic, partitions=2)
    acks = Acks()
    p = Producer(dict(conf, acks="all"))
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), on_delivery=acks)
    assert p.flush(30) == 0
    assert acks.errors == [] and len(acks.acked) == n, acks.errors
    got = consume_values(conf, topic, n)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(n))
    # Each record at its acknowledged offset, nothing else.
    assert read_back(conf, topic, 2) == acks.of(topic)


def test_confluent_sasl_ssl_scram(tls_broker):
    roundtrip(tls_broker, sasl_ssl_conf(tls_broker, "SCRAM-SHA-512"))
    md = AdminClient(sasl_ssl_conf(tls_broker)).list_topics(timeout=20)
    [broker] = md.brokers.values()
    assert broker.port == tls_broker.sasl_ssl_port


def test_confluent_mutual_tls_principal(tls_broker):
    roundtrip(tls_broker, ssl_conf(tls_broker, client_cert=True), n=5)
    log = tls_broker.log_path.read_text(errors="replace")
    assert "User:CN=client,O=Tessera" in log, tls_broker.log_tail()
    # requested, not required: a client without a certificate is served too.
    roundtrip(tls_broker, ssl_conf(tls_broker, client_cert=False), n=5)


@pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test.sh installs it)")
def test_kcat_sasl_ssl_scram(tls_broker):
    topic = unique_topic("kcat-tls")
    create_topic(tls_broker, topic)
    args = [KCAT, "-b", f"{tls_broker.host}:{tls_broker.sasl_ssl_port}",
            "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={tls_broker.certs / 'ca.pem'}",
            "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=bob",
            "-X", "sasl.password=bob-secret"]
    lines = [f"tls line {i}".encode() for i in range(100)]
    p = subprocess.run([*args, "-P", "-t", topic], input=b"\n".join(lines) + b"\n",
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([*args, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split(b"\n")[:-1] == lines


def test_plaintext_client_on_tls_port_is_dropped(tls_broker):
    before = broker_metric(tls_broker, "tessera_tls_handshake_failures_total")
    # An ApiVersions v0 request in plaintext.
    body = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    with socket.create_connection((tls_broker.host, tls_broker.ssl_port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        s.settimeout(15)
        data = s.recv(4096)
        # rustls may answer with a TLS alert record before closing; never a
        # Kafka response.
        while data:
            assert data[:1] in (b"\x15", b"\x16"), data[:16]
            data = s.recv(4096)
    assert broker_metric(tls_broker, "tessera_tls_handshake_failures_total") == before + 1
    assert "TLS handshake failed" in tls_broker.log_path.read_text(errors="replace")
    # Everyone else is served.
    roundtrip(tls_broker, sasl_ssl_conf(tls_broker, "SCRAM-SHA-256"), n=5)


def test_client_auth_required(broker_factory, tmp_path):
    """ssl.client.auth=required: a client without a certificate is refused
    in the handshake, one with a certificate from the truststore's CA is
    served."""
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's TLS setup")
    make_certs(tmp_path)
    b = broker_factory(start=False)
    b.ssl_port = free_port()
    b.certs = tmp_path
    chain = open(tmp_path / "server.pem").read()
    key = open(tmp_path / "server.key").read()
    b.overrides.update(
        {
            "listeners": f"PLAINTEXT://{b.host}:{b.port},SSL://{b.host}:{b.ssl_port}",
            # The PEM text form of the keystore this time.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": chain,
            "ssl.keystore.key": key,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tmp_path / "ca.pem"),
            "ssl.client.auth": "required",
        }
    )
    b.start()
    before = broker_metric(b, "tessera_tls_handshake_failures_total")
    a = AdminClient(ssl_conf(b, client_cert=False))
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException):
        a.list_topics(timeout=5)
    assert broker_metric(b, "tessera_tls_handshake_failures_total") > before
    roundtrip(b, ssl_conf(b, client_cert=True), n=5)


def served_certificate(b, port: int) -> str:
    """The PEM certificate a TLS listener presents to a new connection."""
    return ssl.DER_cert_to_PEM_cert(
        ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((b.host, port), timeout=10)))


def same_cert(pem_a: str, pem_b: str) -> bool:
    return ssl.PEM_cert_to_DER_cert(pem_a) == ssl.PEM_cert_to_DER_cert(pem_b)


def set_broker_config(a: AdminClient, key: str, value: str):
    resource = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    for f in a.incremental_alter_configs([resource]).values():
        f.result(timeout=30)


def test_certificates_rotate_without_a_restart(tls_broker, tmp_path_factory):
    """The SSL listener's keystore is replaced by a per-broker
    IncrementalAlterConfigs of listener.name.ssl.ssl.keystore.location:
    new connections get the new certificate (clients trusting the new CA
    are served), the SASL_SSL listener keeps the old one, a connection
    opened before keeps working; setting the same path again re-reads the
    file; a path that does not load is refused and changes nothing; the
    rotated certificate survives a restart."""
    b = tls_broker
    old = (b.certs / "server.pem").read_text()
    assert same_cert(served_certificate(b, b.ssl_port), old)
    # A producer connected with the old certificate before the rotation.
    topic = unique_topic("rotate")
    create_topic(b, topic)
    acks = Acks()
    early = Producer(dict(ssl_conf(b, client_cert=False), acks="all"))
    early.produce(topic, value=b"before", on_delivery=acks)
    assert early.flush(30) == 0

    rotated = tmp_path_factory.mktemp("rotated")
    make_certs(rotated)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    set_broker_config(admin, "listener.name.ssl.ssl.keystore.location", str(rotated / "keystore.pem"))
    new = (rotated / "server.pem").read_text()
    assert same_cert(served_certificate(b, b.ssl_port), new)
    assert same_cert(served_certificate(b, b.sasl_ssl_port), old)
    # Clients trusting the new CA are served; one trusting only the old
    # CA is refused on the SSL listener.
    new_ca = dict(ssl_conf(b, client_cert=False), **{"ssl.ca.location": str(rotated / "ca.pem")})
    roundtrip(b, new_ca, n=5)
    stale = Producer(dict(ssl_conf(b, client_cert=False), **{"message.timeout.ms": 5000}))
    failed = []
    stale.produce(topic, value=b"stale", on_delivery=lambda err, _m: failed.append(err))
    stale.flush(15)
    assert len(failed) == 1 and failed[0] is not None, "a client trusting only the old CA cannot deliver"
    # The connection opened before still works.
    early.produce(topic, value=b"after", on_delivery=acks)
    assert early.flush(30) == 0
    # Both at their acknowledged offsets, and the refused record nowhere.
    assert acks.errors == [], acks.errors
    assert read_back({"bootstrap.servers": b.bootstrap}, topic, 1) == acks.of(topic) == {
        (0, 0): b"before", (0, 1): b"after"}

    # The same path with a new file behind it: re-set, re-read.
    third = tmp_path_factory.mktemp("third")
    make_certs(third)
    shutil.copy(third / "keystore.pem", rotated / "keystore.pem")
    set_broker_config(admin, "listener.name.ssl.ssl.keystore.location", str(rotated / "keystore.pem"))
    newest = (third / "server.pem").read_text()
    assert same_cert(served_certificate(b, b.ssl_port), newest)
    # DescribeConfigs lists the override as Kafka does: dynamic, with the
    # unprefixed key among its synonyms.
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])
    [configs] = [f.result(timeout=30) for f in described.values()]
    override = configs["listener.name.ssl.ssl.keystore.location"]
    assert override.value == str(rotated / "keystore.pem")
    assert override.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert [s.name for s in override.synonyms.values()] == [
        "listener.name.ssl.ssl.keystore.location", "ssl.keystore.location"]

    # A file that does not load: refused, nothing changes.
    with pytest.raises(KafkaException) as e:
        set_broker_config(admin, "listener.name.ssl.ssl.keystore.location", str(rotated / "missing.pem"))
    assert "INVALID_REQUEST" in str(e.value) or "SSLFactory" in str(e.value), e.value
    assert same_cert(served_certificate(b, b.ssl_port), newest)
    b.restart()
    assert same_cert(served_certificate(b, b.ssl_port), newest)
    assert same_cert(served_certificate(b, b.sasl_ssl_port), old)
