"""TLS with real clients: a broker with PLAINTEXT, SSL and SASL_SSL
listeners (PEM keystore and truststore made here with the openssl CLI,
ssl.client.auth=requested). confluent-kafka and kcat over SASL_SSL with
SCRAM, confluent-kafka over SSL with a client certificate (the broker
derives the principal from its DN), and a plaintext client on the TLS port
dropped cleanly while everyone else is served."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from conftest import free_port, tessera_bin
from helpers import create_topic, unique_topic

KCAT = os.environ.get("KCAT") or shutil.which("kcat") or shutil.which("kafkacat")
OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not installed")


def openssl(*args, cwd):
    p = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode(errors="replace")


def make_certs(d):
    """A CA, a server certificate for 127.0.0.1/localhost and a client
    certificate (CN=client,O=Tessera), EC keys, unencrypted PKCS#8."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=Tessera Test CA", cwd=d)
    for name, subj, ext in [
        ("server", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "/O=Tessera/CN=client", "extendedKeyUsage=clientAuth"),
    ]:
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
                cwd=d)
    # The keystore: key and chain in one PEM file (ssl.keystore.location).
    with open(os.path.join(d, "keystore.pem"), "w") as out:
        for part in ("server.key", "server.pem"):
            out.write(open(os.path.join(d, part)).read())


@pytest.fixture
def tls_broker(broker_factory, tmp_path):
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's TLS setup")
    make_certs(tmp_path)
    b = broker_factory(start=False, env={"RUST_LOG": "info,tessera_gateway::server=debug"})
    b.ssl_port, b.sasl_ssl_port = free_port(), free_port()
    b.certs = tmp_path
    b.overrides.update(
        {
            "listeners": f"PLAINTEXT://{b.host}:{b.port},SSL://{b.host}:{b.ssl_port},"
            f"SASL_SSL://{b.host}:{b.sasl_ssl_port}",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tmp_path / "keystore.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tmp_path / "ca.pem"),
            "ssl.client.auth": "requested",
        }
    )
    out = subprocess.run(
        [str(tessera_bin()), "--data-dir", str(b.data_dir), "users", "add", "bob",
         "--password", "bob-secret"],
        capture_output=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    b.start()
    return b


def sasl_ssl_conf(b, mechanism="SCRAM-SHA-512") -> dict:
    return {
        "bootstrap.servers": f"{b.host}:{b.sasl_ssl_port}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(b.certs / "ca.pem"),
        "sasl.mechanisms": mechanism,
        "sasl.username": "bob",
        "sasl.password": "bob-secret",
    }


def ssl_conf(b, client_cert: bool) -> dict:
    conf = {
        "bootstrap.servers": f"{b.host}:{b.ssl_port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(b.certs / "ca.pem"),
    }
    if client_cert:
        conf["ssl.certificate.location"] = str(b.certs / "client.pem")
        conf["ssl.key.location"] = str(b.certs / "client.key")
    return conf


def roundtrip(b, conf: dict, n: int = 30):
    topic = unique_topic("tls")
    create_topic(b, topic, partitions=2)
    p = Producer(dict(conf, acks="all"))
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode())
    assert p.flush(30) == 0
    c = Consumer(dict(conf, **{"group.id": unique_topic("g"), "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m.value())
    finally:
        c.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(n))


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


def metric(b, name: str) -> int:
    with urllib.request.urlopen(b.admin_url("/metrics"), timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return int(line.split()[1])
    return 0


def test_plaintext_client_on_tls_port_is_dropped(tls_broker):
    before = metric(tls_broker, "tessera_tls_handshake_failures_total")
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
    assert metric(tls_broker, "tessera_tls_handshake_failures_total") == before + 1
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
    before = metric(b, "tessera_tls_handshake_failures_total")
    a = AdminClient(ssl_conf(b, client_cert=False))
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException):
        a.list_topics(timeout=5)
    assert metric(b, "tessera_tls_handshake_failures_total") > before
    roundtrip(b, ssl_conf(b, client_cert=True), n=5)
