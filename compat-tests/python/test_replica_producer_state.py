"""A leader that does not hold a range's older segments still knows its
idempotent producers (issue 9).

On 5 nodes, an RF=3 topic gets three batches from a hand-built idempotent
producer (epoch 0, then a KIP-360 epoch bump to 1); a first failover opens
the next segment on the two survivors and a spare, which holds none of the
segment the batches are in; a second failover makes that spare the leader.
A retry of the last acknowledged batch must be answered with its original
offset (or DUPLICATE_SEQUENCE_NUMBER) and append nothing, and a batch of the
old epoch must be fenced (INVALID_PRODUCER_EPOCH / PRODUCER_FENCED), as on
the broker that took them. Before the spare fetched the producer snapshot
where its first segment starts, both were appended. A transaction aborted
in the first segment stays hidden from a read_committed consumer reading
from the spare (its marker is in a segment the spare never held).

The second test makes the spare the leader while that snapshot is not on
it and no live broker serves it: it must answer NOT_LEADER_OR_FOLLOWER
(retriable, nothing appended) until a replica that has the snapshot is back,
then answer as above. Before the new leader waited for the snapshot, it
appended the retry again at offset 10.

The batches are hand-built (Produce v3, InitProducerId v0 over a socket) so
that the test can replay a batch exactly, which no client library does on
demand.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from test_cluster import cluster, eventually, http, node_pid  # noqa: F401 - fixture
from test_replication import create_replicated, hand_leadership_to, leader_of, node_cmd, restart_node

from kafka.record._crc32c import crc as crc32c

NONE = 0
NOT_LEADER_OR_FOLLOWER = 6
LEADER_NOT_AVAILABLE = 5
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
REQUEST_TIMED_OUT = 7
KAFKA_STORAGE_ERROR = 56
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90
RETRIABLE = {NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS,
             NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR}


def varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def idempotent_batch(pid: int, epoch: int, base_sequence: int, values: list[bytes]) -> bytes:
    """A v2 record batch of an idempotent (non-transactional) producer."""
    ts = int(time.time() * 1000)
    records = b""
    for i, v in enumerate(values):
        body = b"\x00" + varint(0) + varint(i) + varint(-1) + varint(len(v)) + v + varint(0)
        records += varint(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", 0, len(values) - 1, ts, ts, pid, epoch, base_sequence,
                            len(values)) + records
    crc = crc32c(after_crc)
    after_length = struct.pack(">ibI", -1, 2, crc) + after_crc
    return struct.pack(">qi", 0, len(after_length)) + after_length


class RawClient:
    """One connection to one broker; requests with header v1, no client id."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0

    def close(self):
        self.sock.close()

    def _recv(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    def request(self, api_key: int, version: int, body: bytes) -> bytes:
        self.correlation += 1
        msg = struct.pack(">hhih", api_key, version, self.correlation, -1) + body
        self.sock.sendall(struct.pack(">i", len(msg)) + msg)
        size = struct.unpack(">i", self._recv(4))[0]
        resp = self._recv(size)
        assert struct.unpack(">i", resp[:4])[0] == self.correlation
        return resp[4:]

    def init_producer_id(self) -> tuple[int, int]:
        resp = self.request(22, 0, struct.pack(">hi", -1, 60000))
        _throttle, error, pid, epoch = struct.unpack(">ihqh", resp[:16])
        assert error == NONE, error
        return pid, epoch

    def produce(self, topic: str, partition: int, batch: bytes, acks: int) -> tuple[int, int]:
        """(error code, base offset) of one batch, Produce v3."""
        name = topic.encode()
        body = struct.pack(">hhi", -1, acks, 30000)
        body += struct.pack(">i", 1) + struct.pack(">h", len(name)) + name
        body += struct.pack(">i", 1) + struct.pack(">i", partition)
        body += struct.pack(">i", len(batch)) + batch
        resp = self.request(0, 3, body)
        at = 4  # one topic
        (name_len,) = struct.unpack(">h", resp[at:at + 2])
        at += 2 + name_len + 4  # one partition
        _p, error, base_offset = struct.unpack(">ihq", resp[at:at + 14])
        return error, base_offset


def produce_until_answered(address: str, topic: str, batch: bytes, acks: int,
                           timeout: float = 60) -> tuple[int, int]:
    """Produces `batch`, retrying while the answer is retriable (leadership
    settling, followers coming back)."""
    deadline = time.monotonic() + timeout
    while True:
        client = RawClient(address)
        try:
            error, offset = client.produce(topic, 0, batch, acks)
        finally:
            client.close()
        if error not in RETRIABLE or time.monotonic() > deadline:
            return error, offset
        time.sleep(0.5)


def high_watermark(boot: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": boot, "group.id": "hw-probe"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def read_values(boot: str, topic: str, count: int, isolation: str) -> list[bytes]:
    """Values from offset 0 until `count` are read (or 60 s pass), and
    whatever else arrives within a second after that."""
    c = Consumer({"bootstrap.servers": boot, "group.id": f"reader-{isolation}",
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
        if len(got) >= count:
            deadline = min(deadline, time.monotonic() + 1)
    c.close()
    return got


def ready(admin_url: str) -> bool:
    try:
        with urllib.request.urlopen(admin_url + "/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def snapshot_held(workdir: Path, node: int, topic: str, seq: int) -> bool:
    pattern = f"**/{topic}-*/*/{seq:010}.snapshot"
    return any((workdir / "cluster" / f"node-{node}").glob(pattern))


class History:
    """Steps shared by the tests: an RF=3 topic on 5 nodes gets three
    idempotent batches (epoch 0, then 1) and an aborted transaction in
    segment 0; a kill -9 of its primary opens segment 1 on the two
    survivors (`holder`, its primary, and `other`) and a `spare` that holds
    none of segment 0."""

    def __init__(self, cluster, topic: str):
        self.cluster = cluster
        self.topic = topic
        self.boot = ",".join(cluster["bootstrap"])
        self.workdir = cluster["workdir"]
        self.admin = create_replicated(self.boot, topic, 1, 3, {"min.insync.replicas": "2"})
        self.alive = set(range(1, 6))

        first = self.active_replicas()
        p0 = first[0]
        leader_addr = cluster["bootstrap"][p0 - 1]
        client = RawClient(leader_addr)
        self.pid, _ = client.init_producer_id()
        client.close()
        self.batches = [
            idempotent_batch(self.pid, 0, 0, [b"a0", b"a1", b"a2"]),
            idempotent_batch(self.pid, 0, 3, [b"b0", b"b1"]),
            # The client bumps its epoch (KIP-360): sequences start over.
            idempotent_batch(self.pid, 1, 0, [b"c0", b"c1"]),
        ]
        offsets = [produce_until_answered(leader_addr, topic, b, acks=-1) for b in self.batches]
        assert offsets == [(NONE, 0), (NONE, 3), (NONE, 5)], offsets
        # A transaction aborted in the same segment: offsets 7-8, marker at 9.
        txn = Producer({"bootstrap.servers": self.boot, "transactional.id": "aborted-early"})
        txn.init_transactions(30)
        txn.begin_transaction()
        for v in (b"x0", b"x1"):
            txn.produce(topic, value=v, partition=0)
        txn.flush(30)
        txn.abort_transaction(30)
        eventually("the abort marker", lambda: high_watermark(self.boot, topic) == 10, timeout=30)

        # kill -9 the primary: the next segment opens on the two survivors
        # and a spare, which holds none of the segment with the batches.
        cmd_p0 = node_cmd(self.workdir, p0)
        os.kill(node_pid(self.workdir, p0), signal.SIGKILL)
        self.alive.discard(p0)
        eventually("a new leader", lambda: leader_of(self.admin, topic) not in (p0, -1), timeout=60)
        restart_node(self.workdir, p0, cmd_p0)
        # Back before the next kills: a broker whose registration is forwarded
        # to a controller that stops meanwhile exits at startup.
        eventually("the first primary back", lambda: ready(cluster["admin"][p0 - 1]), timeout=60)
        self.alive.add(p0)
        second = self.active_replicas()
        self.spare = next(r for r in second if r not in first)
        self.holder, self.other = second[0], next(r for r in second[1:] if r != self.spare)
        self.spare_addr = cluster["bootstrap"][self.spare - 1]

    def active_replicas(self) -> list[int]:
        # From any node that answers (a restarted one may not be up yet, a
        # node's image may not show the topic yet).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for node in sorted(self.alive):
                try:
                    segments = http(self.cluster["admin"][node - 1] + "/segments")
                except OSError:
                    continue
                active = [s["replicas"] for s in segments
                          if s["topic"] == self.topic and s["sealed_bytes"] is None]
                if active:
                    return active[0]
            time.sleep(0.2)
        raise AssertionError("no node shows the topic's active segment")

    def move_holders_snapshot_aside(self) -> tuple[list[Path], Path]:
        """With prefetch off, the spare holds no `<1>.snapshot`; moves
        `holder`'s `<1>.snapshot` and `<1>.aborted` out of its range
        directory (no broker can serve them then). The files and where
        they went."""
        time.sleep(3)
        assert not snapshot_held(self.workdir, self.spare, self.topic, 1), \
            "the test-only key did not stop the fetch"
        files = [f for suffix in ("snapshot", "aborted")
                 for f in (self.workdir / "cluster" / f"node-{self.holder}").glob(
                     f"**/{self.topic}-*/*/{1:010}.{suffix}")]
        assert len(files) == 2, files
        aside = self.workdir / "moved-aside"
        aside.mkdir()
        for f in files:
            f.rename(aside / f.name)
        return files, aside

    def hand_leadership_to_spare(self, while_down=None):
        """kill -9 `other`, SIGTERM `holder`: the spare leads segment 2."""
        hand_leadership_to(self.spare, self.workdir, self.admin, self.topic, self.holder,
                           self.other, self.alive, while_down)
        local = {s["seq"]: s for s in http(self.cluster["admin"][self.spare - 1] + "/segments")
                 if s["topic"] == self.topic}
        assert self.spare not in local[0]["replicas"], local[0]

    def check_the_spare_knows_the_producers(self):
        """What the broker that took the batches would answer."""
        topic, boot = self.topic, self.boot
        # A retry of the last acknowledged batch: its original offset, nothing appended.
        retry = produce_until_answered(self.spare_addr, topic, self.batches[2], acks=1)
        assert retry in [(NONE, 5), (DUPLICATE_SEQUENCE_NUMBER, -1)] or retry[0] == DUPLICATE_SEQUENCE_NUMBER, retry
        # The old epoch is fenced.
        stale = produce_until_answered(self.spare_addr, topic,
                                       idempotent_batch(self.pid, 0, 5, [b"stale"]), acks=1)
        assert stale[0] in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED), stale
        assert leader_of(self.admin, topic) == self.spare
        assert high_watermark(boot, topic) == 10
        # The producer goes on at its epoch and next sequence.
        assert produce_until_answered(self.spare_addr, topic,
                                      idempotent_batch(self.pid, 1, 2, [b"d0"]), acks=1) == (NONE, 10)
        # read_committed from the start: the transaction aborted in the segment
        # the spare never held is left out (its marker is there only).
        kept = [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0", b"c1"]
        assert read_values(boot, topic, 10, "read_uncommitted") == kept + [b"x0", b"x1", b"d0"]
        assert read_values(boot, topic, 8, "read_committed") == kept + [b"d0"]


def metric(admin_url: str, name: str) -> float:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


@pytest.mark.cluster_nodes(5)
# Re-placement would move a follower onto the restarted first primary and
# change the replica set the steps below are planned on.
@pytest.mark.cluster_overrides({"replica.placement.rebalance.enable": "false",
                                "replica.placement.roll.enable": "false"})
def test_a_leader_without_the_history_answers_retries_and_fences_old_epochs(cluster):
    h = History(cluster, "producers")
    # Give the spare a moment to follow the segment (not asserted: without
    # the producer snapshot transfer the file never comes, and the checks
    # below are what must fail).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not snapshot_held(h.workdir, h.spare, h.topic, 1):
        time.sleep(0.5)
    print(f"\nspare {h.spare} holds the producer snapshot of segment 1: "
          f"{snapshot_held(h.workdir, h.spare, h.topic, 1)}")

    # kill -9 the other survivor, then SIGTERM the leader: only the spare
    # answers the fence besides the leader itself, so it leads next.
    h.hand_leadership_to_spare()
    h.check_the_spare_knows_the_producers()


@pytest.mark.cluster_nodes(5)
@pytest.mark.cluster_overrides({"replica.placement.rebalance.enable": "false",
                                "replica.placement.roll.enable": "false",
                                "replica.producer.snapshot.prefetch.enable": "false"})
def test_a_leader_waits_for_the_producer_state_of_the_history_it_lacks(cluster):
    """The spare becomes the leader while the producer snapshot where its
    segment starts is NOT on it, and the brokers that have it are down.

    `replica.producer.snapshot.prefetch.enable=false` (a test-only key)
    keeps the spare from fetching `<1>.snapshot`/`<1>.aborted` while it
    follows segment 1. (Deleting the fetched files from the spare instead
    would race: it fetches them again at its next reconcile pass for as
    long as it follows segment 1 and a replica serves them.) Only
    `holder`, the primary of segment 1, has the files (the first primary
    never had them, `other` holds segment 0 and needs none). The test moves
    them out of `holder`'s range directory: `holder` runs the seal that
    makes the spare the leader (SIGTERM, controlled shutdown) and would
    otherwise still serve them to the spare in those seconds, which is the
    happy path. `other` is killed, so the spare leads segment 2 and no
    broker can serve the snapshot.

    While `holder` and `other` are down the spare must not serve the
    partition: for 10 s every answer to a retry of the last acknowledged
    batch is retriable (NOT_LEADER_OR_FOLLOWER), and the spare counts the
    wait in `tessera_producer_snapshot_waits_total`. Then the files go
    back into `holder`'s directory and both restart: the spare fetches the
    snapshot from `holder`, opens its log and answers as the broker that
    took the batches would (the checks of the test above). Before the
    change the spare opened its log at once without that state and
    appended the retry again at offset 10."""
    h = History(cluster, "waiting")
    files, aside = h.move_holders_snapshot_aside()

    def retries_are_refused():
        answers = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            client = RawClient(h.spare_addr)
            try:
                answers.append(client.produce(h.topic, 0, h.batches[2], 1))
            finally:
                client.close()
            assert answers[-1][0] in RETRIABLE, f"answered before the producer state was here: {answers}"
            time.sleep(0.5)
        assert any(e == NOT_LEADER_OR_FOLLOWER for e, _ in answers), answers
        assert not snapshot_held(h.workdir, h.spare, h.topic, 1)
        waits = metric(cluster["admin"][h.spare - 1], "tessera_producer_snapshot_waits_total")
        assert waits >= 1, waits
        for f in files:
            (aside / f.name).rename(f)

    h.hand_leadership_to_spare(while_down=retries_are_refused)
    h.check_the_spare_knows_the_producers()
    assert snapshot_held(h.workdir, h.spare, h.topic, 1)


@pytest.mark.cluster_nodes(5)
@pytest.mark.cluster_overrides({"replica.placement.rebalance.enable": "false",
                                "replica.placement.roll.enable": "false",
                                "replica.producer.snapshot.prefetch.enable": "false"})
def test_a_leader_no_replica_can_give_the_producer_state_hands_the_range_on(cluster):
    """As above, but the snapshot never comes back: `holder`'s copy of
    `<1>.snapshot` stays moved aside, so no broker can serve it, while
    `holder` and `other`, back up, hold the whole history and could lead.
    After about half a minute of asking (`RESIGN_AFTER_ATTEMPTS`), the
    spare hands the range on: its unopened segment is sealed by quorum
    avoiding it, a broker with the history leads the next one, and it
    answers the retry and the stale epoch as the broker that took the
    batches would. Before, the spare waited for good and the partition
    stayed unwritable (found by the replication simulation)."""
    h = History(cluster, "resign")
    h.move_holders_snapshot_aside()  # and never put back

    h.hand_leadership_to_spare()
    eventually("the range handed on", lambda: leader_of(h.admin, h.topic) not in (h.spare, -1),
               timeout=120)
    resigned = metric(cluster["admin"][h.spare - 1], "tessera_producer_snapshot_resignations_total")
    assert resigned >= 1, resigned
    leader = leader_of(h.admin, h.topic)
    # Any broker with the history may take it (the first primary, back up,
    # holds segment 0 too); what it answers is what matters.
    assert leader != h.spare, leader
    addr = cluster["bootstrap"][leader - 1]
    retry = produce_until_answered(addr, h.topic, h.batches[2], acks=1)
    assert retry == (NONE, 5) or retry[0] == DUPLICATE_SEQUENCE_NUMBER, retry
    stale = produce_until_answered(addr, h.topic, idempotent_batch(h.pid, 0, 5, [b"stale"]), acks=1)
    assert stale[0] in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED), stale
    assert produce_until_answered(addr, h.topic, idempotent_batch(h.pid, 1, 2, [b"d0"]),
                                  acks=-1) == (NONE, 10)
    kept = [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0", b"c1"]
    assert read_values(h.boot, h.topic, 10, "read_uncommitted") == kept + [b"x0", b"x1", b"d0"]
    assert read_values(h.boot, h.topic, 8, "read_committed") == kept + [b"d0"]
