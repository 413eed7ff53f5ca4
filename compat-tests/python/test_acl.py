"""ACLs with real clients: a broker with `authorizer.class.name` set, a
PLAINTEXT listener (the inter-broker one, whose connections are ANONYMOUS,
named a super user as a Kafka operator with a PLAINTEXT inter-broker
listener does) and a SASL_PLAINTEXT listener with PLAIN users admin (a super user), alice and
bob. ACLs are managed with kafka-python's KafkaAdminClient and with
confluent-kafka's AdminClient; alice may produce and consume topics
prefixed `a-` (and read her group), bob is denied and sees
TopicAuthorizationFailed / GroupAuthorizationFailed in his client."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from conftest import free_port
from helpers import create_topic, kafka_python_sasl_conf, sasl_conf, unique_topic

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'user_admin="admin-secret" user_alice="alice-secret" user_bob="bob-secret";'
)


@pytest.fixture
def acl_broker(broker_factory):
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's SASL + ACL setup")
    b = broker_factory(start=False)
    b.sasl_port = free_port()
    b.overrides.update(
        {
            "listeners": f"PLAINTEXT://{b.host}:{b.port},SASL_PLAINTEXT://{b.host}:{b.sasl_port}",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # The brokers' principal on a PLAINTEXT inter-broker listener
            # is ANONYMOUS (test setup goes through it too).
            "super.users": "User:admin;User:ANONYMOUS",
        }
    )
    b.start()
    b.sasl_bootstrap = f"{b.host}:{b.sasl_port}"
    return b


def conf(b, user: str, **extra) -> dict:
    """PLAIN as `user`, whose password is `<user>-secret`."""
    return sasl_conf(b, "PLAIN", user, f"{user}-secret", **extra)


def kafka_python_conf(b, user: str) -> dict:
    return kafka_python_sasl_conf(b, "PLAIN", user, f"{user}-secret")


def grant_alice(b, group: str):
    """alice: ALL on topics prefixed a-, READ on `group` (confluent AdminClient as admin)."""
    a = AdminClient(conf(b, "admin"))
    bindings = [
        AclBinding(ResourceType.TOPIC, "a-", ResourcePatternType.PREFIXED, "User:alice", "*",
                   AclOperation.ALL, AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL, "User:alice", "*",
                   AclOperation.READ, AclPermissionType.ALLOW),
    ]
    for f in a.create_acls(bindings, request_timeout=30).values():
        f.result(timeout=30)


def test_confluent_admin_create_describe_delete_acls(acl_broker):
    a = AdminClient(conf(acl_broker, "admin"))
    binding = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL,
                         "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
    for f in a.create_acls([binding], request_timeout=30).values():
        assert f.result(timeout=30) is None
    any_filter = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    described = a.describe_acls(any_filter, request_timeout=30).result(timeout=30)
    assert described == [binding]
    # MATCH: the ACLs that apply to topic "orders".
    match = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert a.describe_acls(match, request_timeout=30).result(timeout=30) == [binding]
    # A non-super user may not manage ACLs: CreateAcls answers
    # CLUSTER_AUTHORIZATION_FAILED. (bob's DescribeAcls is refused too, but
    # librdkafka drops DescribeAcls' top-level error code and reports an
    # empty list; the Rust test and kafka-python check that error.)
    bob = AdminClient(conf(acl_broker, "bob"))
    assert bob.describe_acls(any_filter, request_timeout=30).result(timeout=30) == []
    with pytest.raises(KafkaException) as e:
        for f in bob.create_acls([binding], request_timeout=30).values():
            f.result(timeout=30)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    deleted = a.delete_acls([any_filter], request_timeout=30)
    assert list(deleted.values())[0].result(timeout=30) == [binding]
    assert a.describe_acls(any_filter, request_timeout=30).result(timeout=30) == []


def test_kafka_python_admin_acls(acl_broker):
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KResourceType

    admin = KafkaAdminClient(**kafka_python_conf(acl_broker, "admin"))
    try:
        acl = ACL(
            principal="User:bob",
            host="*",
            operation=ACLOperation.WRITE,
            permission_type=ACLPermissionType.DENY,
            resource_pattern=ResourcePattern(KResourceType.TOPIC, "b-", ACLResourcePatternType.PREFIXED),
        )
        result = admin.create_acls([acl])
        assert not result["failed"], result
        assert len(result["succeeded"]) == 1
        topics = ResourcePatternFilter(KResourceType.TOPIC, None, ACLResourcePatternType.ANY)
        acl_filter = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=topics,
        )
        acls, error = admin.describe_acls(acl_filter)
        assert error.errno == 0, error
        assert [(x.principal, x.operation, x.permission_type, x.resource_pattern.resource_name,
                 x.resource_pattern.pattern_type) for x in acls] == [
            ("User:bob", ACLOperation.WRITE, ACLPermissionType.DENY, "b-",
             ACLResourcePatternType.PREFIXED)
        ]
        deleted = admin.delete_acls([acl_filter])
        [(f, matched, err)] = deleted
        assert err.errno == 0, err
        assert len(matched) == 1
        assert matched[0].principal == "User:bob"
        acls, _ = admin.describe_acls(acl_filter)
        assert acls == []
    finally:
        admin.close()

    # alice is no super user: CLUSTER_AUTHORIZATION_FAILED.
    from kafka.errors import ClusterAuthorizationFailedError

    alice = KafkaAdminClient(**kafka_python_conf(acl_broker, "alice"))
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            alice.describe_acls(acl_filter)
    finally:
        alice.close()


def test_confluent_produce_consume_allowed_and_denied(acl_broker):
    group = unique_topic("g")
    grant_alice(acl_broker, group)
    allowed = unique_topic("a-t")
    denied = unique_topic("b-t")
    create_topic(acl_broker, allowed)
    create_topic(acl_broker, denied)

    # alice produces and consumes a-*.
    p = Producer(conf(acl_broker, "alice", acks="all"))
    for i in range(20):
        p.produce(allowed, value=f"v{i}".encode())
    assert p.flush(30) == 0
    c = Consumer(conf(acl_broker, "alice", **{"group.id": group, "auto.offset.reset": "earliest"}))
    c.subscribe([allowed])
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < 20 and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m.value())
        c.commit(asynchronous=False)
    finally:
        c.close()
    assert got == [f"v{i}".encode() for i in range(20)]

    # bob's produce fails with TOPIC_AUTHORIZATION_FAILED.
    errors = []
    p = Producer(conf(acl_broker, "bob", acks="all", **{"message.timeout.ms": 10_000}))
    p.produce(allowed, value=b"x", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]

    # alice on a topic outside her prefix: denied too.
    errors = []
    p = Producer(conf(acl_broker, "alice", acks="all", **{"message.timeout.ms": 10_000}))
    p.produce(denied, value=b"x", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors

    # bob's consumer in alice's group: GROUP_AUTHORIZATION_FAILED surfaces.
    c = Consumer(conf(acl_broker, "bob", **{"group.id": group, "auto.offset.reset": "earliest"}))
    c.subscribe([allowed])
    seen = None
    deadline = time.monotonic() + 30
    try:
        while seen is None and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and m.error() is not None:
                seen = m.error()
    finally:
        c.close()
    assert seen is not None
    assert seen.code() in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED), seen


def test_kafka_python_produce_denied_and_allowed(acl_broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    group = unique_topic("kg")
    grant_alice(acl_broker, group)
    topic = unique_topic("a-kp")
    create_topic(acl_broker, topic)

    p = KafkaProducer(acks="all", **kafka_python_conf(acl_broker, "alice"))
    for i in range(10):
        p.send(topic, f"m{i}".encode()).get(30)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10_000,
                      group_id=group, **kafka_python_conf(acl_broker, "alice"))
    got = [m.value for m in c]
    c.close()
    assert got == [f"m{i}".encode() for i in range(10)]

    # Without idempotence: bob's InitProducerId would be refused first
    # (CLUSTER_AUTHORIZATION_FAILED: no IDEMPOTENT_WRITE, no WRITE anywhere).
    p = KafkaProducer(acks="all", max_block_ms=10_000, enable_idempotence=False,
                      **kafka_python_conf(acl_broker, "bob"))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            p.send(topic, b"x").get(30)
    finally:
        p.close(timeout=5)
