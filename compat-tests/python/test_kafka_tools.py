"""scripts/kafka-tools: Kafka's `kafka-topics.sh` and `kafka-acls.sh` as far
as librdkafka's integration tests call them (0052, 0077: topics with
configs; 0109, 0115, 0119: ACLs for `User:*`), over the Kafka protocol.
The tools are what `./scripts/librdkafka-suite.sh` hands those tests as
`$KAFKA_PATH`; here each command is checked by its effect on a real
client, and bad input by its exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import ConfigResource, ResourceType

from helpers import admin, unique_topic

TOOLS = Path(__file__).resolve().parents[2] / "scripts" / "kafka-tools" / "bin"

pytestmark = pytest.mark.broker_overrides(
    {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true",
    }
)


def tool(name: str, broker, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESSERA_PYTHON=sys.executable)
    return subprocess.run(
        [str(TOOLS / f"{name}.sh"), "--bootstrap-server", broker.bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def produce_one(broker, topic: str) -> KafkaError | None:
    """The delivery error of one record (None when it was acknowledged)."""
    outcome: list[KafkaError | None] = []
    p = Producer(
        {"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10000, "acks": "all"}
    )
    p.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
    p.flush(20)
    assert outcome, "no delivery report"
    return outcome[0]


def test_kafka_topics_creates_with_configs_describes_and_refuses_a_second_create(broker):
    topic = unique_topic("tools")
    created = tool(
        "kafka-topics", broker, "--create", "--topic", topic, "--partitions", "3",
        "--replication-factor", "1", "--config", "cleanup.policy=compact",
        "--config", "message.timestamp.type=LogAppendTime",
    )
    assert created.returncode == 0, created.stderr
    assert f"Created topic {topic}." in created.stdout

    a = admin(broker)
    res = ConfigResource(ResourceType.TOPIC, topic)
    configs = a.describe_configs([res])[res].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["message.timestamp.type"].value == "LogAppendTime"

    described = tool("kafka-topics", broker, "--describe", "--topic", topic)
    assert described.returncode == 0, described.stderr
    assert "PartitionCount: 3" in described.stdout
    assert described.stdout.count("Leader: ") == 3

    again = tool("kafka-topics", broker, "--create", "--topic", topic, "--partitions", "1")
    assert again.returncode == 1
    assert "already exists" in again.stderr
    assert tool(
        "kafka-topics", broker, "--create", "--if-not-exists", "--topic", topic
    ).returncode == 0

    missing = tool("kafka-topics", broker, "--describe", "--topic", unique_topic("none"))
    assert missing.returncode == 1
    bad_config = tool(
        "kafka-topics", broker, "--create", "--topic", unique_topic("bad"),
        "--config", "cleanup.policy=sometimes",
    )
    assert bad_config.returncode == 1, "an invalid config is the broker's INVALID_CONFIG"


def test_kafka_acls_deny_then_remove_as_librdkafkas_auth_tests_do(broker):
    topic = unique_topic("tools-acl")
    assert tool("kafka-topics", broker, "--create", "--topic", topic).returncode == 0
    assert produce_one(broker, topic) is None

    deny = ("--deny-principal", "User:*", "--operation", "All", "--deny-host", "*",
            "--topic", topic)
    added = tool("kafka-acls", broker, "--add", *deny)
    assert added.returncode == 0, added.stderr
    listed = tool("kafka-acls", broker, "--list", "--topic", topic)
    assert "principal=User:*" in listed.stdout and "permissionType=DENY" in listed.stdout

    err = produce_one(broker, topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    refused = tool("kafka-acls", broker, "--remove", *deny)
    assert refused.returncode != 0, "--remove without --force must not act silently"
    removed = tool("kafka-acls", broker, "--remove", "--force", *deny)
    assert removed.returncode == 0, removed.stderr
    assert "permissionType=DENY" not in tool("kafka-acls", broker, "--list").stdout
    assert produce_one(broker, topic) is None


def test_kafka_acls_refuses_what_it_does_not_know(broker):
    unknown_op = tool("kafka-acls", broker, "--add", "--allow-principal", "User:x",
                      "--operation", "Juggle", "--topic", "t")
    assert unknown_op.returncode != 0 and "Invalid operation" in unknown_op.stderr
    no_resource = tool("kafka-acls", broker, "--add", "--allow-principal", "User:x")
    assert no_resource.returncode != 0
    unknown_option = tool("kafka-acls", broker, "--add", "--delegation-token", "x")
    assert unknown_option.returncode != 0
