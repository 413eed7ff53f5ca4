#!/usr/bin/env python3
"""Replication benchmark on a local 3-node cluster (`tessera cluster --nodes 3`,
release binary, data on disk, all on this machine's loopback):

  * produce throughput and latency to a 6-partition topic with replication
    factor 1 against one with replication factor 3 (`min.insync.replicas=2`),
    confluent-kafka, acks=all, idempotent, linger.ms=5, 1 KiB values, N
    records flat out (default 200,000), median of R runs interleaved;
  * failover time: a paced producer (2,000 records/s) to the RF=3 topic, the
    primary of its range killed with SIGKILL after 5 s; the longest pause
    between two acknowledgements is the client-visible unavailability
    (mostly `broker.session.timeout.ms`, 3 s here, before the seal).

Markdown on stdout, progress on stderr. Not a test: bench/replication.sh.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat-tests" / "python"))
import procguard  # noqa: E402
from test_cluster import free_block, node_pid  # noqa: E402

VALUE = os.urandom(1024)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def start_cluster(binary: str):
    workdir = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    kafka, admin, ctl = free_block(3), free_block(3), free_block(3)
    proc = procguard.spawn(
        [binary, "-o", "range.policy.enable=false",
         "-o", "broker.heartbeat.interval.ms=500", "-o", "broker.session.timeout.ms=3000",
         "cluster", "--nodes", "3", "--base-port", str(kafka),
         "--admin-base-port", str(admin), "--controller-base-port", str(ctl),
         "--dir", str(workdir / "cluster")],
        cwd=workdir, stdout=open(workdir / "cluster.log", "wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if all(urllib.request.urlopen(f"http://127.0.0.1:{admin + i}/ready", timeout=2).status == 200
                   for i in range(3)):
                break
        except OSError:
            pass
        time.sleep(0.5)
    return proc, workdir, ",".join(f"127.0.0.1:{kafka + i}" for i in range(3))


def stop_cluster(proc, workdir):
    procguard.kill(proc)
    for i in (1, 2, 3):
        pid = node_pid(workdir, i)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def create(boot, name, rf):
    a = AdminClient({"bootstrap.servers": boot})
    a.create_topics([NewTopic(name, 6, rf, config={"min.insync.replicas": str(min(rf, 2))})])[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = a.list_topics(name, timeout=10).topics.get(name)
        if t and t.error is None and all(p.leader > 0 for p in t.partitions.values()):
            return a
        time.sleep(0.2)
    raise RuntimeError("topic not ready")


def flat_out(boot, topic, n):
    lat, errs = [], []
    p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "queue.buffering.max.messages": 1000000})

    def cb(err, msg, t0):
        if err:
            errs.append(err)
        else:
            lat.append(time.monotonic() - t0)
    start = time.monotonic()
    for i in range(n):
        t0 = time.monotonic()
        while True:
            try:
                p.produce(topic, VALUE, key=str(i).encode(), on_delivery=lambda e, m, t0=t0: cb(e, m, t0))
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(120)
    took = time.monotonic() - start
    lat.sort()
    return {"rps": n / took, "mbps": n * 1024 / took / 1e6, "p50": lat[len(lat) // 2] * 1000,
            "p99": lat[int(len(lat) * 0.99)] * 1000, "errors": len(errs)}


def failover(boot, workdir, admin, topic):
    acks = []
    p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    start = time.monotonic()
    killed_at = None
    i = 0
    while time.monotonic() - start < 20:
        p.produce(topic, VALUE, on_delivery=lambda e, m: acks.append(time.monotonic()) if not e else None)
        i += 1
        p.poll(0)
        if killed_at is None and time.monotonic() - start > 5:
            leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
            os.kill(node_pid(workdir, leader), signal.SIGKILL)
            killed_at = time.monotonic()
        time.sleep(0.0005)
    p.flush(60)
    window = sorted([killed_at] + [t for t in acks if t > killed_at])
    return max(b - a for a, b in zip(window, window[1:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    binary = os.path.abspath(os.environ.get("TESSERA_BIN", "target/release/tessera"))
    proc, workdir, boot = start_cluster(binary)
    try:
        create(boot, "rf1", 1)
        admin = create(boot, "rf3", 3)
        runs = {"rf1": [], "rf3": []}
        for r in range(args.repeat):
            for topic in ("rf1", "rf3"):
                res = flat_out(boot, topic, args.records)
                log(f"run {r + 1} {topic}: {res}")
                runs[topic].append(res)
        med = {t: {k: statistics.median(x[k] for x in v) for k in v[0]} for t, v in runs.items()}
        gap = failover(boot, workdir, admin, "rf3")
    finally:
        stop_cluster(proc, workdir)
    print(f"Replication, 3 nodes on one machine, {args.records} x 1 KiB, acks=all, median of {args.repeat}\n")
    print("| topic | records/s | MB/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|")
    for t in ("rf1", "rf3"):
        m = med[t]
        print(f"| {t} | {m['rps']:.0f} | {m['mbps']:.1f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['errors']:.0f} |")
    print(f"\nRF=3 / RF=1: throughput {med['rf3']['rps'] / med['rf1']['rps']:.2f}x, "
          f"p99 {med['rf3']['p99'] / med['rf1']['p99']:.2f}x")
    print(f"Failover (kill -9 of the RF=3 primary, session timeout 3 s): longest pause between acks {gap:.2f} s")


if __name__ == "__main__":
    main()
