"""`tessera migrate` with real clients: from tansu (committed and aborted
transactions, three groups' offsets) and from another tessera (kill -9 of
the migrator mid-way, then a resumed run; continuous mode until cutover).
Consumers switch bootstrap servers and continue from their committed
offsets with no loss and no duplicate."""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource

import procguard
from conftest import Broker, free_port, tessera_bin
from helpers import admin, create_topic, poll_until_idle
from tls_setup import needs_openssl, sasl_ssl_conf, start_tls_broker

MIGRATION = {"migration.append.enable": "true"}


def tansu(tmp: Path) -> Broker:
    return Broker(tmp, kind="tansu").start()


def migrate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(tessera_bin()), "migrate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def consume_all(bootstrap: str, topic: str, partitions: int, group: str | None = None,
                committed: bool = True, idle: int = 3) -> list[tuple]:
    """(partition, offset, key, value) read_committed; from the group's
    committed offsets when `group` is given, else from offset 0."""
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group or "reader",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    c = Consumer(conf)
    if group is None:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    else:
        # From the group's committed offsets.
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
    out = []
    for m in poll_until_idle(c, idle):
        out.append((m.partition(), m.offset(), m.key(), m.value()))
        if group is not None and committed:
            c.commit(message=m, asynchronous=False)
    c.close()
    return sorted(out)


def produce_workload(bootstrap: str, topic: str, n: int) -> set[tuple]:
    """n plain records with headers, a committed and an aborted transaction;
    returns the (key, value) pairs a read_committed reader must see."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    expected = set()
    for i in range(n):
        k, v = f"k{i}".encode(), f"value-{i}".encode()
        p.produce(topic, key=k, value=v, headers=[("h", str(i).encode())])
        expected.add((k, v))
    p.flush(30)
    t = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    t.init_transactions(30)
    t.begin_transaction()
    for i in range(50):
        t.produce(topic, key=f"a{i}".encode(), value=b"aborted")
    t.flush(30)
    t.abort_transaction(30)
    t.begin_transaction()
    for i in range(50):
        k = f"c{i}".encode()
        t.produce(topic, key=k, value=b"committed")
        expected.add((k, b"committed"))
    t.commit_transaction(30)
    for i in range(n, n + 100):
        k, v = f"k{i}".encode(), f"value-{i}".encode()
        p.produce(topic, key=k, value=v)
        expected.add((k, v))
    p.flush(30)
    return expected


def commit_groups(bootstrap: str, topic: str, partitions: int) -> dict[str, dict[int, int]]:
    """Three groups with different committed offsets (with metadata)."""
    groups = {}
    for gi, fraction in enumerate([0.25, 0.5, 0.9]):
        group = f"g{gi}"
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        ends = {}
        for p in range(partitions):
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = int(high * fraction)
        c.commit(offsets=[TopicPartition(topic, p, o, f"meta-{group}-{p}") for p, o in ends.items()],
                 asynchronous=False)
        c.close()
        groups[group] = ends
    return groups


def test_migrate_from_tansu_with_transactions_and_groups(broker_factory):
    with tempfile.TemporaryDirectory() as tmp:
        source = tansu(Path(tmp))
        try:
            target = broker_factory(overrides=MIGRATION)
            topic, partitions = "migrated", 3
            create_topic(source, topic, partitions, config={"retention.ms": "86400000"})
            expected = produce_workload(source.bootstrap, topic, 3000)
            groups = commit_groups(source.bootstrap, topic, partitions)

            run = migrate("--source", source.bootstrap, "--target", target.bootstrap,
                          "--topics", "migr.*", "--groups", "g[0-9]")
            assert run.returncode == 0, run.stdout + run.stderr
            assert "counts and checksums match" in run.stdout
            assert "3 group(s)" in run.stdout

            # Every committed record, at the source's offsets; aborted ones hidden.
            on_target = consume_all(target.bootstrap, topic, partitions)
            assert {(k, v) for _, _, k, v in on_target} == expected
            assert len(on_target) == len(expected)
            raw_source = {(p, o): (k, v) for p, o, k, v in consume_all(source.bootstrap, topic, partitions)}
            for p, o, k, v in on_target:
                assert raw_source[(p, o)] == (k, v)

            # Offsets and metadata of the three groups.
            def committed(bootstrap, group):
                c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
                got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
                c.close()
                return {tp.partition: (tp.offset, tp.metadata) for tp in got}

            for group, ends in groups.items():
                on_source = committed(source.bootstrap, group)
                assert {p: o for p, (o, _) in on_source.items()} == ends
                # Metadata as the source keeps it (tansu drops it).
                assert committed(target.bootstrap, group) == on_source

            # Consumers switch bootstrap and continue: what they read on the
            # source before their commit plus what they read on the target
            # after it is every record once.
            for group, ends in groups.items():
                before = [r for r in on_target if r[1] < ends[r[0]]]
                after = consume_all(target.bootstrap, topic, partitions, group=group)
                assert all(r[1] >= ends[r[0]] for r in after)
                both = before + after
                assert len(both) == len(set(both)) == len(expected)

            # The topic config came along.
            from confluent_kafka.admin import ConfigResource
            res = ConfigResource("topic", topic)
            a = admin(target)
            cfg = a.describe_configs([res])[res].result(30)
            assert cfg["retention.ms"].value == "86400000"
        finally:
            procguard.kill(source.proc)


def metric(url: str, name: str) -> float:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def test_kill_9_midway_then_resume_copies_nothing_twice(broker_factory):
    source = broker_factory()
    target = broker_factory(overrides=MIGRATION)
    topic, partitions = "resumed", 4
    create_topic(source, topic, partitions)
    p = Producer({"bootstrap.servers": source.bootstrap, "linger.ms": 20, "batch.num.messages": 200})
    for i in range(200_000):
        p.produce(topic, key=str(i).encode(), value=b"x" * 100, partition=i % partitions)
        if i % 10000 == 0:
            p.poll(0)
    p.flush(60)
    commit_groups(source.bootstrap, topic, partitions)

    metrics_port = free_port()
    proc = procguard.spawn(
        [str(tessera_bin()), "migrate", "--source", source.bootstrap, "--target", target.bootstrap,
         "--topics", topic, "--groups", "g.*", "--parallelism", "1",
         "--admin-listener", f"127.0.0.1:{metrics_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    deadline = time.monotonic() + 60
    while metric(url, "tessera_migrate_records_total") == 0 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.kill()  # kill -9 mid-way
    proc.wait(10)
    copied_before = metric(target.admin_url("/metrics"), "tessera_migrated_bytes_total")
    assert copied_before > 0

    run = migrate("--source", source.bootstrap, "--target", target.bootstrap,
                  "--topics", topic, "--groups", "g.*")
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(r"copied (\d+) records", run.stdout)
    assert m and int(m.group(1)) < 200_000, run.stdout
    # Nothing copied twice, nothing missed: the target took exactly the
    # source's produced bytes through MigrateAppend.
    produced = metric(source.admin_url("/metrics"), "tessera_produced_bytes_total")
    migrated = metric(target.admin_url("/metrics"), "tessera_migrated_bytes_total")
    assert migrated == produced
    # Record by record: the same (partition, offset, key, value) on both.
    copied = consume_all(target.bootstrap, topic, partitions)
    assert len(copied) == 200_000
    assert copied == consume_all(source.bootstrap, topic, partitions)


def test_continuous_until_cutover_then_consumers_switch(broker_factory):
    source = broker_factory()
    target = broker_factory(overrides=MIGRATION)
    topic, partitions = "tailed", 2
    create_topic(source, topic, partitions)
    stop = threading.Event()
    produced = []

    def producer():
        p = Producer({"bootstrap.servers": source.bootstrap, "linger.ms": 5})
        i = 0
        while not stop.is_set():
            p.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
            produced.append(i)
            i += 1
            if i % 100 == 0:
                p.flush(10)
                time.sleep(0.01)
        p.flush(30)

    writer = threading.Thread(target=producer)
    writer.start()
    # A consumer group works on the source meanwhile, committing as it goes.
    group_conf = {"bootstrap.servers": source.bootstrap, "group.id": "g-live",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False}
    seen = []
    c = Consumer(group_conf)
    c.subscribe([topic])

    cutover = Path(tempfile.mkdtemp()) / "cutover"
    metrics_port = free_port()
    proc = procguard.spawn(
        [str(tessera_bin()), "migrate", "--source", source.bootstrap, "--target", target.bootstrap,
         "--topics", topic, "--groups", "g-live", "--continuous", "--cutover-file", str(cutover),
         "--group-sync-ms", "200", "--admin-listener", f"127.0.0.1:{metrics_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            seen.append((m.partition(), m.offset(), m.value()))
            c.commit(message=m, asynchronous=False)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    assert metric(url, "tessera_migrate_records_total") > 0
    # Cutover: stop the application on the source, then the producers.
    c.close()
    stop.set()
    writer.join(30)
    done = subprocess.run([str(tessera_bin()), "migrate", "cutover", "--cutover-file", str(cutover)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "counts and checksums match" in out

    # The consumer continues on the target from its committed offsets.
    c = Consumer({**group_conf, "bootstrap.servers": target.bootstrap})
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    for m in poll_until_idle(c, 4):
        seen.append((m.partition(), m.offset(), m.value()))
    c.close()
    values = [v for _, _, v in seen]
    assert len(values) == len(set(values)) == len(produced), (len(values), len(set(values)), len(produced))
    assert sorted(values) == sorted(f"v{i}".encode() for i in produced)
    # The target holds the source's records at the source's offsets, and the
    # group read each at that offset on whichever side it was.
    source_records = consume_all(source.bootstrap, topic, partitions)
    assert consume_all(target.bootstrap, topic, partitions) == source_records
    assert sorted(seen) == sorted((p, o, v) for p, o, _k, v in source_records)


def watermarks(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                for p in range(partitions)]
    finally:
        c.close()


def stable_records(bootstrap: str, topic: str, partitions: int, below: int,
                   timeout: float = 240) -> list[tuple]:
    """Reads the topic until the cleaner has left fewer than `below` records
    and two reads in a row agree (no pass is running); returns them."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        records = consume_all(bootstrap, topic, partitions, idle=2)
        if len(records) < below and records == last:
            return records
        last = records
        time.sleep(1)
    raise AssertionError(f"{topic} not compacted below {below}: {len(last or [])} records")


def test_compacted_source_keeps_its_offset_gaps(broker_factory):
    """A compacted source (gaps between offsets, tombstones, transaction
    markers) arrives with every record at its offset and nothing else."""
    source = broker_factory(overrides={"log.cleaner.backoff.ms": "100"})
    # The target's cleaner stays off until the copy is verified (a pass in
    # between would make the target hold less than the source).
    target = broker_factory(overrides={**MIGRATION, "log.cleaner.enable": "false"})
    topic, partitions, keys = "compacted", 2, 200
    create_topic(source, topic, partitions, config={
        "cleanup.policy": "compact", "segment.bytes": str(16 * 1024),
        "segment.ms": "500", "min.cleanable.dirty.ratio": "0.01",
    })
    p = Producer({"bootstrap.servers": source.bootstrap, "linger.ms": 5,
                  "enable.idempotence": True})
    for i in range(20_000):
        p.produce(topic, key=f"k{i % keys}".encode(), value=f"v{i}".encode())
        if i % 5_000 == 0:
            p.flush(30)
    for i in range(0, keys, 10):
        p.produce(topic, key=f"k{i}".encode(), value=None)
    p.flush(30)
    t = Producer({"bootstrap.servers": source.bootstrap, "transactional.id": "tx-compacted"})
    t.init_transactions(30)
    t.begin_transaction()
    t.produce(topic, key=b"aborted", value=b"x")
    t.flush(30)
    t.abort_transaction(30)
    t.begin_transaction()
    t.produce(topic, key=b"committed", value=b"y")
    t.commit_transaction(30)
    # Rolls happen on appends: a trickle after segment.ms seals the tail.
    time.sleep(0.6)
    for i in range(partitions * 4):
        p.produce(topic, key=b"trickle", value=str(i).encode(), partition=i % partitions)
    p.flush(30)

    before = stable_records(source.bootstrap, topic, partitions, below=5_000)
    offsets = [o for (_, o, _, _) in before]
    assert len(set(offsets)) < max(offsets), "no gap left by compaction"
    done = migrate("--source", source.bootstrap, "--target", target.bootstrap,
                   "--topics", topic, "--groups", "")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "counts and checksums match" in done.stdout

    assert consume_all(target.bootstrap, topic, partitions) == before
    assert watermarks(target.bootstrap, topic, partitions) == watermarks(
        source.bootstrap, topic, partitions)
    target_admin = admin(target)
    policy = target_admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    entries = list(policy.values())[0].result(timeout=30)
    assert entries["cleanup.policy"].value == "compact"


@needs_openssl
def test_source_over_sasl_ssl_with_scram(broker_factory, tmp_path):
    """The migrator reaches a source over SASL_SSL (SCRAM-SHA-512, the CA
    from ssl.ca.location); a wrong password fails cleanly, writing nothing."""
    source = start_tls_broker(broker_factory, tmp_path)
    target = broker_factory(overrides=MIGRATION)
    topic = "secured"
    create_topic(source, topic, 2)
    conf = sasl_ssl_conf(source)
    p = Producer({**conf, "acks": "all"})
    for i in range(500):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": "g-secured"})
    c.commit(offsets=[TopicPartition(topic, 0, 7, "meta")], asynchronous=False)
    c.close()
    security = ["--source-config", "security.protocol=SASL_SSL",
                "--source-config", "sasl.mechanism=SCRAM-SHA-512",
                "--source-config", "sasl.username=bob",
                "--source-config", f"ssl.ca.location={source.certs / 'ca.pem'}"]
    sasl_ssl = f"{source.host}:{source.sasl_ssl_port}"

    wrong = migrate("--source", sasl_ssl, "--target", target.bootstrap, "--topics", topic,
                    *security, "--source-config", "sasl.password=wrong")
    assert wrong.returncode != 0
    assert "SaslAuthenticate" in wrong.stderr, wrong.stderr
    md = admin(target).list_topics(timeout=10)
    assert topic not in md.topics

    done = migrate("--source", sasl_ssl, "--target", target.bootstrap, "--topics", topic,
                   "--groups", "g-secured", *security,
                   "--source-config", "sasl.password=bob-secret")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "counts and checksums match" in done.stdout
    got = consume_all(target.bootstrap, topic, 2)
    assert sorted((k, v) for (_, _, k, v) in got) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(500))
    g = Consumer({"bootstrap.servers": target.bootstrap, "group.id": "g-secured"})
    [committed] = g.committed([TopicPartition(topic, 0)], timeout=10)
    assert (committed.offset, committed.metadata) == (7, "meta")
    g.close()


def read_records(bootstrap: str, topic: str, idle: int = 3) -> list[tuple]:
    """(offset, key, value, timestamp, headers) of partition 0 from offset 0."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "legacy-reader",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    for m in poll_until_idle(c, idle):
        headers = [(k.encode(), v) for k, v in (m.headers() or [])]
        out.append((m.offset(), m.key(), m.value(), m.timestamp()[1], headers))
    c.close()
    return out


def test_migrate_from_a_legacy_v0_v1_source(broker_factory):
    """A source partition holding message format v0 and v1 messages
    (uncompressed; gzip, Kafka-v0-framed lz4 and snappy wrappers, one under
    LogAppendTime), offset gaps and a v2 batch migrates: every record at
    its original offset with its key, value and timestamp (v0: none, -1),
    verification passes, and a changed record on the source is caught."""
    from fake_legacy_kafka import FakeLegacyKafka, legacy_partition

    topic = "legacy"
    entries, expect = legacy_partition()
    source = FakeLegacyKafka(topic, entries).start()
    try:
        target = broker_factory(overrides=MIGRATION)
        done = migrate("--source", source.bootstrap, "--target", target.bootstrap,
                       "--topics", topic, "--groups", "")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"verified 1 partition(s): {len(expect)} records, counts and checksums match" \
            in done.stdout, done.stdout
        assert read_records(target.bootstrap, topic) == expect
        assert watermarks(target.bootstrap, topic, 1) == [(0, source.high_watermark)]
        # A second run copies nothing and still verifies.
        again = migrate("--source", source.bootstrap, "--target", target.bootstrap,
                        "--topics", topic, "--groups", "")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.startswith("copied 0 records"), again.stdout
    finally:
        source.stop()

    # The same log with one value changed on the source: verification fails.
    tampered, _ = legacy_partition(tamper=True)
    other = FakeLegacyKafka(topic, tampered).start()
    try:
        check = migrate("--source", other.bootstrap, "--target", target.bootstrap,
                        "--topics", topic, "--groups", "", "--verify-only")
        assert check.returncode == 1, check.stdout + check.stderr
        assert f"MISMATCH {topic}-0 offsets [0, 16): checksums differ" in check.stdout, check.stdout
    finally:
        other.stop()


def test_legacy_source_tailed_then_resumed_after_kill9(broker_factory):
    """Continuous mode over a v0/v1 source that keeps growing; the migrator
    is killed -9 mid-way and started again: every record at its offset,
    none copied twice, verified at cutover."""
    from fake_legacy_kafka import FakeLegacyKafka, legacy_partition, more_legacy

    topic = "legacy-tail"
    entries, expect = legacy_partition()
    # The source starts with the first half of its log and grows while tailed.
    source = FakeLegacyKafka(topic, entries[:5]).start()
    target = broker_factory(overrides=MIGRATION)
    cutover = Path(tempfile.mkdtemp()) / "cutover"

    def start_migrator():
        return procguard.spawn(
            [str(tessera_bin()), "migrate", "--source", source.bootstrap, "--target", target.bootstrap,
             "--topics", topic, "--groups", "", "--continuous", "--cutover-file", str(cutover)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def caught_up(timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if watermarks(target.bootstrap, topic, 1) == [(0, source.high_watermark)]:
                    return
            except KafkaException as e:  # the topic not yet created on the target
                assert e.args[0].code() in (KafkaError._UNKNOWN_PARTITION,
                                            KafkaError.UNKNOWN_TOPIC_OR_PART), e
            time.sleep(0.3)
        raise AssertionError(f"target never reached {source.high_watermark}")

    try:
        proc = start_migrator()
        caught_up()
        source.entries.extend(entries[5:])
        caught_up()
        proc.kill()
        proc.wait(10)
        more, more_expect = more_legacy(source.high_watermark, 8)
        source.entries.extend(more)
        proc = start_migrator()
        caught_up()
        done = subprocess.run([str(tessera_bin()), "migrate", "cutover", "--cutover-file", str(cutover)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
        total = len(expect) + len(more_expect)
        assert f"verified 1 partition(s): {total} records, counts and checksums match" in out, out
        assert read_records(target.bootstrap, topic) == expect + more_expect
        assert watermarks(target.bootstrap, topic, 1) == [(0, source.high_watermark)]
    finally:
        source.stop()


def test_source_over_sasl_oauthbearer(broker_factory):
    """The migrator logs in to an OAUTHBEARER source with librdkafka's
    unsecured-token settings; a token without the scope the source
    requires is refused, nothing written."""
    from test_sasl import start_sasl_broker

    source = start_sasl_broker(broker_factory)
    target = broker_factory(overrides=MIGRATION)
    topic = "oauth-source"
    create_topic(source, topic, 2)
    p = Producer({"bootstrap.servers": source.bootstrap, "acks": "all"})
    for i in range(200):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0
    security = ["--source-config", "security.protocol=SASL_PLAINTEXT",
                "--source-config", "sasl.mechanism=OAUTHBEARER",
                "--source-config", "enable.sasl.oauthbearer.unsecure.jwt=true"]

    wrong = migrate("--source", source.sasl_bootstrap, "--target", target.bootstrap,
                    "--topics", topic, *security,
                    "--source-config", "sasl.oauthbearer.config=principal=alice scope=other")
    assert wrong.returncode != 0
    assert "SaslAuthenticate" in wrong.stderr and "scope" in wrong.stderr, wrong.stderr
    assert topic not in admin(target).list_topics(timeout=10).topics

    done = migrate("--source", source.sasl_bootstrap, "--target", target.bootstrap,
                   "--topics", topic, *security,
                   "--source-config", "sasl.oauthbearer.config=principal=alice scope=tessera")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified 2 partition(s): 200 records, counts and checksums match" in done.stdout, done.stdout
    got = consume_all(target.bootstrap, topic, 2)
    assert sorted((k, v) for (_, _, k, v) in got) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(200))


def test_source_cleaned_after_the_copy_verifies_record_by_record(broker_factory):
    """A compacted source whose cleaner runs after the copy: the target
    keeps superseded records the source has since removed. Verification
    compares such a partition record by record and accepts them (every
    source record is on the target at its offset, every extra one is
    superseded); consumers of the target read the latest value of each key."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    source = broker_factory(overrides={"log.cleaner.backoff.ms": "200"})
    target = broker_factory(overrides={**MIGRATION, "log.cleaner.enable": "false"})
    topic = "cleaned-later"
    # The cleaner is held back (min.compaction.lag.ms) while the copy runs.
    create_topic(source, topic, 1, config={
        "cleanup.policy": "compact", "segment.bytes": str(64 * 1024),
        "min.cleanable.dirty.ratio": "0.01", "segment.ms": "1000",
        "min.compaction.lag.ms": "3600000"})
    p = Producer({"bootstrap.servers": source.bootstrap, "acks": "all"})
    for i in range(3000):
        p.produce(topic, key=f"k{i % 20}".encode(), value=f"v{i}-".encode() * 10)
    assert p.flush(30) == 0
    time.sleep(1.5)  # segment.ms: the next record rolls, the rest is sealed
    p.produce(topic, key=b"roll", value=b"last")
    assert p.flush(30) == 0
    done = migrate("--source", source.bootstrap, "--target", target.bootstrap,
                   "--topics", topic, "--groups", "")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "counts and checksums match" in done.stdout, done.stdout

    # Now the source's cleaner runs.
    a = admin(source)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    for f in a.incremental_alter_configs([resource]).values():
        f.result(timeout=30)
    deadline = time.monotonic() + 120
    while len(cleaned := consume_all(source.bootstrap, topic, 1)) > 100:
        assert time.monotonic() < deadline, f"the source still holds {len(cleaned)} records"
        time.sleep(1)

    check = migrate("--source", source.bootstrap, "--target", target.bootstrap,
                    "--topics", topic, "--groups", "", "--verify-only")
    assert check.returncode == 0, check.stdout + check.stderr
    # At least what the source had removed when read above (its cleaner
    # may have gone on since).
    kept = re.search(r"the target also keeps (\d+) superseded record\(s\)", check.stdout)
    assert kept and int(kept.group(1)) >= 3001 - len(cleaned), check.stdout
    latest = {k: v for (_, _, k, v) in consume_all(target.bootstrap, topic, 1)}
    assert latest == {k: v for (_, _, k, v) in cleaned}
