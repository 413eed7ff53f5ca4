"""Transactions with real clients: commit/abort visibility (read_committed vs
read_uncommitted) with confluent-kafka and kafka-python, fencing by a second
producer with the same transactional.id, consume-transform-produce with
send_offsets_to_transaction through a kill -9 of the application and
through kill -9s of the broker, and open
transactions across a broker restart (aborted on timeout, LSO moves on).
Also the admin side (DescribeTransactions, ListTransactions,
DescribeProducers) through kafka-python's admin client."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

import procguard
from helpers import Acks, create_topic, read_back, unique_topic

N_TXNS = 100
PARTITIONS = 3


def txn_producer(broker, txn_id, **extra):
    conf = {
        "bootstrap.servers": broker.bootstrap,
        "transactional.id": txn_id,
        "linger.ms": 0,
    }
    conf.update(extra)
    return Producer(conf)


def read_all(broker, topic, partitions, isolation, timeout=60.0):
    """Reads every partition from the beginning up to its end (the LSO for
    read_committed) and returns the values."""
    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
        ends = {}
        for tp in tps:
            _, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
            ends[tp.partition] = high
        c.assign(tps)
        values = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            positions = {tp.partition: tp.offset for tp in c.position(tps)}
            if all(positions[p] >= ends[p] for p in ends):
                break
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(m.error())
            values.append(m.value().decode())
        else:
            raise AssertionError(f"did not reach the end {ends}, at {positions}")
        return values, ends
    finally:
        c.close()


def interleaved_expectation():
    committed, everything = [], []
    for i in range(N_TXNS):
        vals = [f"{i}-{p}" for p in range(PARTITIONS)]
        everything += vals
        if i % 2 == 0:
            committed += vals
    return sorted(committed), sorted(everything)


def test_commit_and_abort_interleaved_confluent(broker):
    topic = unique_topic("txn-ck")
    create_topic(broker, topic, partitions=PARTITIONS)
    p = txn_producer(broker, f"tx-{uuid.uuid4().hex[:8]}")
    p.init_transactions(30)
    for i in range(N_TXNS):
        p.begin_transaction()
        for part in range(PARTITIONS):
            p.produce(topic, value=f"{i}-{part}".encode(), partition=part)
        if i % 2 == 0:
            p.commit_transaction(30)
        else:
            p.flush(30)  # the records are in the log, then aborted
            p.abort_transaction(30)
    committed, everything = interleaved_expectation()
    got, ends = read_all(broker, topic, PARTITIONS, "read_committed")
    assert sorted(got) == committed
    got_all, _ = read_all(broker, topic, PARTITIONS, "read_uncommitted")
    assert sorted(got_all) == everything
    # Each partition: 100 records plus 100 markers, all stable.
    assert all(e == 2 * N_TXNS for e in ends.values()), ends


def test_commit_and_abort_interleaved_kafka_python(broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = unique_topic("txn-kp")
    create_topic(broker, topic, partitions=PARTITIONS)
    p = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        transactional_id=f"kp-{uuid.uuid4().hex[:8]}",
    )
    p.init_transactions()
    for i in range(N_TXNS):
        p.begin_transaction()
        for part in range(PARTITIONS):
            p.send(topic, value=f"{i}-{part}".encode(), partition=part)
        if i % 2 == 0:
            p.commit_transaction()
        else:
            p.flush()
            p.abort_transaction()
    p.close()
    committed, everything = interleaved_expectation()

    def consume(isolation, want):
        c = KafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            isolation_level=isolation,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        tps = [KTP(topic, i) for i in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 60
        while len(got) < want and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                got += [r.value.decode() for r in records]
        # Nothing more arrives.
        for records in c.poll(timeout_ms=1000).values():
            got += [r.value.decode() for r in records]
        c.close()
        return sorted(got)

    assert consume("read_committed", len(committed)) == committed
    assert consume("read_uncommitted", len(everything)) == everything


def test_second_producer_fences_the_first(broker):
    topic = unique_topic("txn-fence")
    create_topic(broker, topic, partitions=1)
    txn_id = f"fence-{uuid.uuid4().hex[:8]}"
    p1 = txn_producer(broker, txn_id)
    p1.init_transactions(30)
    p1.begin_transaction()
    p1.produce(topic, value=b"from-p1", partition=0)
    p1.flush(30)

    p2 = txn_producer(broker, txn_id)
    p2.init_transactions(30)  # aborts p1's open transaction and fences it

    with pytest.raises(KafkaException) as err:
        p1.produce(topic, value=b"from-p1-again", partition=0)
        p1.commit_transaction(30)
    e = err.value.args[0]
    assert e.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), e
    assert e.fatal(), e

    p2.begin_transaction()
    p2.produce(topic, value=b"from-p2", partition=0)
    p2.commit_transaction(30)
    got, _ = read_all(broker, topic, 1, "read_committed")
    assert got == ["from-p2"]

    # kafka-python sees the fence as ProducerFencedError too.
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError

    k1 = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
    k1.init_transactions()  # fences p2
    k1.begin_transaction()
    k1.send(topic, value=b"from-k1", partition=0)
    k1.flush()
    k2 = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
    k2.init_transactions()
    with pytest.raises(KPError) as kerr:
        k1.commit_transaction()
    assert "Fenced" in type(kerr.value).__name__ or "Epoch" in type(kerr.value).__name__, kerr.value
    k2.close()


def test_admin_describes_transactions_and_producers(broker):
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    topic = unique_topic("txn-admin")
    create_topic(broker, topic, partitions=1)
    txn_id = f"adm-{uuid.uuid4().hex[:8]}"
    p = txn_producer(broker, txn_id)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"x", partition=0)
    p.flush(30)
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        d = a.describe_transactions([txn_id])[txn_id]
        assert d.state.value == "Ongoing"
        assert KTP(topic, 0) in d.topic_partitions
        listed = [t for ts in a.list_transactions(state_filters=["Ongoing"]).values() for t in ts]
        assert [t.transactional_id for t in listed] == [txn_id], listed
        assert not [
            t for ts in a.list_transactions(state_filters=["CompleteAbort"]).values() for t in ts
        ]
        producers = a.describe_producers([KTP(topic, 0)])
        states = producers[KTP(topic, 0)].active_producers
        assert len(states) == 1 and states[0].producer_id == d.producer_id
        assert states[0].current_transaction_start_offset == 0
        p.commit_transaction(30)
        d = a.describe_transactions([txn_id])[txn_id]
        assert d.state.value == "CompleteCommit"
        assert not d.topic_partitions
    finally:
        a.close()


APP = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Consumer, Producer, KafkaError
    bootstrap, src, dst, group, txn_id = sys.argv[1:6]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "session.timeout.ms": 6000,
                  "heartbeat.interval.ms": 1000})
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 0})
    p.init_transactions(60)
    c.subscribe([src])
    while True:
        msgs = c.consume(num_messages=25, timeout=1.0)
        msgs = [m for m in msgs if not m.error()]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, value=b"out-" + m.value(), partition=m.partition())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        print("committed", len(msgs), flush=True)
        time.sleep(0.1)
    """
)


def committed_count(broker, topic, partitions):
    got, _ = read_all(broker, topic, partitions, "read_committed")
    return got


def eos_setup(broker, tmp_path, prefix: str, n: int, app_text: str):
    """The input topic with `n` records ("0".."n-1", spread over the
    partitions), an empty output topic, and the application's script."""
    src, dst = unique_topic(f"{prefix}-in"), unique_topic(f"{prefix}-out")
    create_topic(broker, src, partitions=PARTITIONS)
    create_topic(broker, dst, partitions=PARTITIONS)
    prod = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(n):
        prod.produce(src, value=f"{i}".encode(), partition=i % PARTITIONS)
    assert prod.flush(30) == 0
    app = tmp_path / "app.py"
    app.write_text(app_text)
    return src, dst, app


def test_consume_transform_produce_exactly_once_through_app_kill(broker, tmp_path):
    n = 1500
    src, dst, app = eos_setup(broker, tmp_path, "eos", n, APP)
    group, txn_id = f"eos-{uuid.uuid4().hex[:6]}", f"eos-{uuid.uuid4().hex[:6]}"
    args = [sys.executable, str(app), broker.bootstrap, src, dst, group, txn_id]

    def run_until(predicate, timeout):
        proc = procguard.spawn(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                got = committed_count(broker, dst, PARTITIONS)
                if predicate(got):
                    return got
                assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
                time.sleep(0.3)
            raise AssertionError("the application made no progress in time")
        finally:
            proc.kill()  # kill -9, mid-transaction as likely as not
            proc.wait(10)

    first = run_until(lambda got: len(got) >= n // 3, 90)
    assert len(first) < n
    final = run_until(lambda got: len(got) >= n, 120)
    time.sleep(0.5)
    final = committed_count(broker, dst, PARTITIONS)
    assert sorted(final) == sorted(f"out-{i}" for i in range(n))
    assert len(set(final)) == len(final)


# A consume-transform-produce application written the crash-only way: any
# error of the transaction or the consumer ends the process, and a
# supervisor starts a new one, whose init_transactions completes or aborts
# whatever the last one left open and which resumes from the group's
# committed offsets. Exactly once then rests on the broker alone.
CRASH_ONLY_APP = textwrap.dedent(
    """
    import os, sys
    from confluent_kafka import Consumer, Producer
    bootstrap, src, dst, group, txn_id = sys.argv[1:6]
    try:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "isolation.level": "read_committed", "session.timeout.ms": 6000,
                      "heartbeat.interval.ms": 1000})
        # No re-bootstrap when the only broker is gone: librdkafka 2.16
        # then decommissions the cached group coordinator and
        # send_offsets_to_transaction waits forever, past its timeout
        # (librdkafka issues #5511 and #5456; seen here on a kill -9).
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                      "linger.ms": 0, "transaction.timeout.ms": 20000,
                      "metadata.recovery.strategy": "none"})
        p.init_transactions(60)
        c.subscribe([src])
        while True:
            msgs = c.consume(num_messages=25, timeout=1.0)
            for m in msgs:
                if m.error():
                    raise RuntimeError(str(m.error()))
            if not msgs:
                continue
            p.begin_transaction()
            for m in msgs:
                p.produce(dst, value=b"out-" + m.value(), partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()),
                                          c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            print("committed", len(msgs), flush=True)
    except Exception as e:
        print("exiting on", repr(e), flush=True)
        os._exit(3)
    """
)


@pytest.mark.timeout(600)
def test_consume_transform_produce_exactly_once_through_broker_kills(broker, tmp_path):
    """kill -9 the broker three times while a consume-transform-produce
    application runs (read_committed in, transactional out, offsets sent to
    the transaction): the committed output holds every input record exactly
    once."""
    n = 2000
    src, dst, app = eos_setup(broker, tmp_path, "eosk", n, CRASH_ONLY_APP)
    group, txn_id = f"eosk-{uuid.uuid4().hex[:6]}", f"eosk-{uuid.uuid4().hex[:6]}"
    args = [sys.executable, str(app), broker.bootstrap, src, dst, group, txn_id]
    app_log = tmp_path / "app.log"

    kill_at = [n // 4, n // 2, 3 * n // 4]
    kills, starts, got = 0, 0, []
    proc = None
    deadline = time.monotonic() + 420
    try:
        while True:
            if proc is None or proc.poll() is not None:
                with open(app_log, "ab") as log:
                    proc = procguard.spawn(args, stdout=log, stderr=subprocess.STDOUT)
                starts += 1
            got = committed_count(broker, dst, PARTITIONS)
            if kills < len(kill_at) and len(got) >= kill_at[kills]:
                broker.kill()  # mid-transaction as likely as not
                broker.start()
                kills += 1
                continue
            if kills == len(kill_at) and len(got) >= n:
                break
            assert time.monotonic() < deadline, (
                f"{len(got)} of {n} after {kills} kills and {starts} starts: "
                + app_log.read_text(errors="replace")[-3000:])
            time.sleep(0.3)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
    time.sleep(0.5)
    final = committed_count(broker, dst, PARTITIONS)
    print(f"\n{n} records through {kills} broker kills, {starts} application starts")
    assert len(set(final)) == len(final), "a record committed twice"
    assert sorted(final) == sorted(f"out-{i}" for i in range(n))


@pytest.mark.broker_overrides(
    {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
)
def test_broker_restart_with_open_transactions(broker):
    topic = unique_topic("txn-restart")
    create_topic(broker, topic, partitions=2)
    committed = txn_producer(broker, f"ok-{uuid.uuid4().hex[:6]}")
    # Acknowledged (partition, offset) -> value: committed, and still open
    # at the restart.
    ok, aborted = Acks(), Acks()
    committed.init_transactions(30)
    committed.begin_transaction()
    committed.produce(topic, value=b"before", partition=0, on_delivery=ok)
    committed.commit_transaction(30)

    open_p = txn_producer(
        broker,
        f"open-{uuid.uuid4().hex[:6]}",
        **{"transaction.timeout.ms": 6000, "message.timeout.ms": 5000, "socket.timeout.ms": 5000},
    )
    open_p.init_transactions(30)
    open_p.begin_transaction()
    for i in range(5):
        open_p.produce(topic, value=f"open-{i}".encode(), partition=i % 2, on_delivery=aborted)
    assert open_p.flush(30) == 0

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lso-probe",
                  "isolation.level": "read_committed"})
    lso_before, _ = c.get_watermark_offsets(TopicPartition(topic, 1), timeout=10, cached=False)
    c.close()
    assert lso_before == 0  # held back by the open transaction

    broker.kill()
    broker.start()

    # The open transaction times out on the restarted broker and is aborted.
    deadline = time.monotonic() + 30
    while True:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lso-probe",
                      "isolation.level": "read_committed"})
        lso = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
               for p in range(2)]
        c.close()
        if lso[1] > 0 and lso[0] > 2:
            break
        assert time.monotonic() < deadline, f"LSO stuck at {lso}"
        time.sleep(0.5)

    # New transactions commit and become visible; the aborted records never do.
    after = txn_producer(broker, f"after-{uuid.uuid4().hex[:6]}")
    after.init_transactions(30)
    after.begin_transaction()
    after.produce(topic, value=b"after", partition=1, on_delivery=ok)
    after.commit_transaction(30)
    got, _ = read_all(broker, topic, 2, "read_committed")
    assert sorted(got) == ["after", "before"]
    # Each record at its acknowledged offset: read_committed the committed
    # ones only, read_uncommitted the aborted ones too.
    assert ok.errors == aborted.errors == [] and (len(ok.acked), len(aborted.acked)) == (2, 5)
    conf = {"bootstrap.servers": broker.bootstrap}
    assert read_back(conf, topic, 2, **{"isolation.level": "read_committed"}) == ok.of(topic)
    assert read_back(conf, topic, 2, **{"isolation.level": "read_uncommitted"}) == {
        **ok.of(topic), **aborted.of(topic)}
