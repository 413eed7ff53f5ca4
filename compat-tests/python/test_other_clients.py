"""Admin, produce and consume with clients the other tests do not use:
aiokafka (asyncio) and kafkajs (Node.js). Both used to stop at their first
admin call (issue 8): aiokafka on CreatePartitions, kafkajs on an API
version the broker did not advertise."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

NODE_DIR = Path(__file__).resolve().parent.parent / "node"


def test_aiokafka_admin_produce_consume(broker):
    boot = broker.bootstrap

    async def run():
        a = AIOKafkaAdminClient(bootstrap_servers=boot)
        await a.start()
        try:
            created = await a.create_topics([NewTopic("aio", 2, 1)])
            assert [e[1] for e in created.topic_errors] == [0]
            grown = await a.create_partitions({"aio": NewPartitions(4)})
            assert [e[1] for e in grown.topic_errors] == [0]
            await a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "aio",
                                                  configs={"retention.ms": "100000"})])
            described = await a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "aio")])
            entries = {e[0]: e[1] for e in described[0].resources[0][4]}
            assert entries["retention.ms"] == "100000"
            assert "aio" in await a.list_topics()

            p = AIOKafkaProducer(bootstrap_servers=boot, enable_idempotence=True)
            await p.start()
            for i in range(40):
                await p.send_and_wait("aio", b"v%d" % i, partition=i % 4)
            await p.stop()
            low = await a.delete_records({TopicPartition("aio", 0): RecordsToDelete(4)})
            assert low == {TopicPartition("aio", 0): 4}

            c = AIOKafkaConsumer("aio", bootstrap_servers=boot, group_id="aio-group",
                                 auto_offset_reset="earliest", enable_auto_commit=False)
            await c.start()
            seen = set()
            async with asyncio.timeout(60):
                while len(seen) < 36:
                    batch = await c.getmany(timeout_ms=500)
                    for records in batch.values():
                        seen.update(r.value for r in records)
            await c.commit()
            await c.stop()
            assert seen == {b"v%d" % i for i in range(40) if not (i % 4 == 0 and i < 16)}

            groups = await a.describe_consumer_groups(["aio-group"])
            assert groups[0].groups[0][2] == "Empty"
            offsets = await a.list_consumer_group_offsets("aio-group")
            assert {tp.partition: o.offset for tp, o in offsets.items()} == {0: 10, 1: 10, 2: 10, 3: 10}
            deleted = await a.delete_topics(["aio"])
            assert [e[1] for e in deleted.topic_error_codes] == [0]
        finally:
            await a.close()

    asyncio.run(run())


def test_kafkajs_admin_produce_consume(broker):
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed (scripts/test.sh installs kafkajs with npm)")
    if not (NODE_DIR / "node_modules" / "kafkajs").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                       capture_output=True, timeout=300)
    out = subprocess.run([node, "admin_roundtrip.js", broker.bootstrap, "kjs"], cwd=NODE_DIR,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "roundtrip ok" in out.stdout
