"""SASL with real clients: a broker with a PLAINTEXT listener and a
SASL_PLAINTEXT listener (PLAIN users from the JAAS key, SCRAM users seeded
with `tessera users add` before start and added with
AlterUserScramCredentials, OAUTHBEARER with Kafka's unsecured-JWS
validation). kafka-python over PLAIN and SCRAM, confluent-kafka and kcat
(librdkafka 2.0.2) over SCRAM, confluent-kafka over OAUTHBEARER.
Re-authentication (KIP-368, `connections.max.reauth.ms`): confluent-kafka
and kafka-python renew their sessions on open connections (a client that
cannot is closed at expiry: gateway/tests/integration/sasl.rs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from conftest import free_port, tessera_bin
from helpers import (broker_metric, consume_values, create_topic, kafka_python_sasl_conf,
                     sasl_conf, unique_topic)

KCAT = os.environ.get("KCAT") or shutil.which("kcat") or shutil.which("kafkacat")

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'user_alice="alice-secret" user_admin="admin-secret";'
)

# Kafka's default OAUTHBEARER validation (unsecured JWS), with a required scope.
OAUTH_JAAS = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
    'unsecuredValidatorRequiredScope="tessera";'
)


@pytest.fixture
def sasl_broker(broker_factory):
    return start_sasl_broker(broker_factory)


def start_sasl_broker(broker_factory, **extra):
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's SASL setup")
    b = broker_factory(start=False)
    b.sasl_port = free_port()
    b.overrides.update(
        {
            "listeners": f"PLAINTEXT://{b.host}:{b.port},SASL_PLAINTEXT://{b.host}:{b.sasl_port}",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": OAUTH_JAAS,
            **extra,
        }
    )
    # The first SCRAM user, written to the data dir before start.
    out = subprocess.run(
        [str(tessera_bin()), "--data-dir", str(b.data_dir), "users", "add", "bob",
         "--password", "bob-secret"],
        capture_output=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    b.start()
    b.sasl_bootstrap = f"{b.host}:{b.sasl_port}"
    return b


def roundtrip_confluent(b, conf: dict, n: int = 50):
    topic = unique_topic("sasl")
    create_topic(b, topic, partitions=2)
    p = Producer(dict(conf, acks="all"))
    for i in range(n):
        p.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0
    got = consume_values(conf, topic, n)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(n))


def test_confluent_scram_sha512_and_sha256(sasl_broker):
    roundtrip_confluent(sasl_broker, sasl_conf(sasl_broker, "SCRAM-SHA-512", "bob", "bob-secret"))
    roundtrip_confluent(sasl_broker, sasl_conf(sasl_broker, "SCRAM-SHA-256", "bob", "bob-secret"))


def test_confluent_metadata_advertises_the_sasl_listener(sasl_broker):
    a = AdminClient(sasl_conf(sasl_broker, "PLAIN", "alice", "alice-secret"))
    md = a.list_topics(timeout=20)
    [broker] = md.brokers.values()
    assert (broker.host, broker.port) == (sasl_broker.host, sasl_broker.sasl_port)
    # The PLAINTEXT listener advertises itself.
    md = AdminClient({"bootstrap.servers": sasl_broker.bootstrap}).list_topics(timeout=20)
    [broker] = md.brokers.values()
    assert broker.port == sasl_broker.port


def refused_by_sasl(b, conf: dict, reason: str):
    """An AdminClient with `conf` gets no metadata, and what stops it is the
    broker's SASL refusal (librdkafka's _AUTHENTICATION with the broker's
    `reason`), counted by the broker, not a timeout or a transport error
    alone."""
    failed = broker_metric(b, "tessera_failed_authentication_total")
    errors = []
    a = AdminClient(dict(conf, error_cb=errors.append))
    with pytest.raises(KafkaException):
        a.list_topics(timeout=5)
    a.poll(1)  # serves error_cb
    refusals = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert refusals, errors
    assert all(reason in e.str() for e in refusals), refusals
    assert broker_metric(b, "tessera_failed_authentication_total") > failed


def test_confluent_wrong_password_fails(sasl_broker):
    refused_by_sasl(sasl_broker, sasl_conf(sasl_broker, "SCRAM-SHA-256", "bob", "wrong"),
                    "invalid credentials with SASL mechanism SCRAM-SHA-256")
    # The broker is unharmed.
    roundtrip_confluent(sasl_broker, sasl_conf(sasl_broker, "SCRAM-SHA-256", "bob", "bob-secret"), n=5)


def oauth_conf(b, jwt: str) -> dict:
    """librdkafka's built-in unsecured JWT (alg none, sub, iat, exp, scope)."""
    return {
        "bootstrap.servers": b.sasl_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": True,
        "sasl.oauthbearer.config": jwt,
    }


def test_confluent_oauthbearer_unsecured_jwt(sasl_broker):
    roundtrip_confluent(sasl_broker, oauth_conf(sasl_broker, "principal=carol scope=tessera,read"))
    # The token lacks the listener's required scope: refused, broker unharmed
    # (expiry, signatures and malformed tokens: gateway/src/sasl/oauthbearer.rs).
    refused_by_sasl(sasl_broker, oauth_conf(sasl_broker, "principal=carol scope=read"),
                    'the token lacks the required scope ["tessera"]')
    roundtrip_confluent(sasl_broker, oauth_conf(sasl_broker, "principal=dave scope=tessera"), n=5)


def test_confluent_alter_user_scram_credentials(sasl_broker):
    a = AdminClient({"bootstrap.servers": sasl_broker.bootstrap})
    fs = a.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(
                "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"carol-secret"
            )
        ]
    )
    for f in fs.values():
        f.result(timeout=30)
    described = a.describe_user_scram_credentials(["carol"])["carol"].result(timeout=30)
    infos = described.scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_256, 8192)]
    roundtrip_confluent(sasl_broker, sasl_conf(sasl_broker, "SCRAM-SHA-256", "carol", "carol-secret"), n=5)


@pytest.mark.parametrize(
    "mechanism,user,password",
    [
        ("PLAIN", "alice", "alice-secret"),
        ("SCRAM-SHA-256", "bob", "bob-secret"),
        ("SCRAM-SHA-512", "bob", "bob-secret"),
    ],
)
def test_kafka_python_sasl_plaintext(sasl_broker, mechanism, user, password):
    from kafka import KafkaConsumer, KafkaProducer

    topic = unique_topic("kp-sasl")
    create_topic(sasl_broker, topic)
    conf = kafka_python_sasl_conf(sasl_broker, mechanism, user, password)
    p = KafkaProducer(acks="all", **conf)
    for i in range(20):
        p.send(topic, f"m{i}".encode()).get(30)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10_000,
                      group_id=unique_topic("kp-g"), **conf)
    got = [m.value for m in c]
    c.close()
    assert got == [f"m{i}".encode() for i in range(20)]


def test_kafka_python_wrong_password(sasl_broker):
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    # kafka-python 3.0 drops the broker's SASL_AUTHENTICATION_FAILED answer
    # when the broker closes the connection after it (the answer is on the
    # wire: gateway/src/sasl/mod.rs), so it reports only that it could not
    # bootstrap; the broker's count and log say why.
    failed = broker_metric(sasl_broker, "tessera_failed_authentication_total")
    conf = kafka_python_sasl_conf(sasl_broker, "PLAIN", "alice", "nope")
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(max_block_ms=5000, **conf)
    assert broker_metric(sasl_broker, "tessera_failed_authentication_total") > failed
    refusals = [line for line in sasl_broker.log_tail(2000).splitlines()
                if "failed authentication" in line and "alice" in line]
    assert refusals and all("Invalid username or password" in line for line in refusals), refusals


@pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test.sh installs it)")
def test_kcat_scram(sasl_broker):
    topic = unique_topic("kcat-sasl")
    create_topic(sasl_broker, topic)
    sasl = ["-b", sasl_broker.sasl_bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
            "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=bob",
            "-X", "sasl.password=bob-secret"]
    lines = [f"line {i}".encode() for i in range(100)]
    p = subprocess.run([KCAT, *sasl, "-P", "-t", topic], input=b"\n".join(lines) + b"\n",
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([KCAT, *sasl, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split(b"\n")[:-1] == lines
    p = subprocess.run([KCAT, *sasl, "-L"], capture_output=True, timeout=60)
    assert f"at {sasl_broker.sasl_bootstrap}".encode() in p.stdout, p.stdout
    # Wrong password: kcat fails, with the broker's message.
    bad = [a if a != "sasl.password=bob-secret" else "sasl.password=x" for a in sasl]
    p = subprocess.run([KCAT, *bad, "-L", "-m", "5"], capture_output=True, timeout=60)
    assert p.returncode != 0
    assert b"Authentication failed" in p.stderr, p.stderr


REAUTH_MS = 3000


def test_clients_reauthenticate_before_their_session_expires(broker_factory):
    """confluent-kafka (SCRAM-SHA-512) and kafka-python (PLAIN) keep
    producing across several session lifetimes: each renews its session on
    its open connection (KIP-368) and nothing is lost or refused."""
    from kafka import KafkaProducer

    b = start_sasl_broker(broker_factory, **{"connections.max.reauth.ms": str(REAUTH_MS)})
    topic = unique_topic("reauth")
    create_topic(b, topic, partitions=2)
    conf = sasl_conf(b, "SCRAM-SHA-512", "bob", "bob-secret")
    errors = []
    p = Producer(dict(conf, acks="all", **{"enable.idempotence": True}))
    kp = KafkaProducer(acks="all", **kafka_python_sasl_conf(b, "PLAIN", "alice", "alice-secret"))
    expected = []
    futures = []
    deadline = time.monotonic() + 3 * REAUTH_MS / 1000 + 1
    n = 0
    while time.monotonic() < deadline:
        p.produce(topic, value=f"c{n}".encode(),
                  on_delivery=lambda err, _msg: err and errors.append(err))
        futures.append(kp.send(topic, f"k{n}".encode()))
        expected += [f"c{n}".encode(), f"k{n}".encode()]
        n += 1
        p.poll(0)
        time.sleep(0.05)
    assert p.flush(30) == 0
    for f in futures:
        f.get(30)
    kp.close()
    assert errors == []
    got = consume_values(conf, topic, len(expected))
    assert sorted(got) == sorted(expected)
    renewed = broker_metric(b, "tessera_successful_reauthentication_total")
    killed = broker_metric(b, "tessera_expired_connections_killed_total")
    print(f"re-authentications {renewed}, expired connections closed {killed}")
    # Two clients, three lifetimes each: several renewals at the least.
    assert renewed >= 2
