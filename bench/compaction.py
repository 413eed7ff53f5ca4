#!/usr/bin/env python3
"""Log cleaner benchmark: how fast the cleaner compacts, what it costs
produce latency while it runs, and disk use under steady load.

1. Cleaner throughput. A compacted topic (3 partitions, segment.bytes 1 MiB)
   is filled with --records records of 1 KiB over --keys keys with the
   cleaner off; the data directory is copied, and for each cleaner setting
   (unthrottled, and --io-limit bytes/s) a broker starts on a copy with the
   cleaner on. While its first pass runs, a probe producer sends 1 KiB
   records (acks=all) to another topic at --probe-rate records/s and
   records send -> delivery latency; the same probe runs against the
   filled broker with the cleaner off first, as the baseline. The
   cleaner's MB/s is the `tessera_cleaner_io_bytes_total` metric (what it
   reads, every segment twice: map then clean, plus what it writes) over
   the time it moved.
2. Disk use under steady load. For --steady-s seconds a producer sends
   --steady-rate records/s of 1 KiB to (a) a `delete` topic with
   retention.ms 10 s and (b) a `compact` topic over 1,000 keys, each on its
   own broker (segment.bytes 1 MiB, retention checked every second, the
   cleaner every second); the data directory's size is sampled every second.

Markdown on stdout, raw JSON with --json, a PNG plot with --plot
(matplotlib). Not a test: scripts/test.sh does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import create_topic  # noqa: E402
from tessera_proc import TesseraProc  # noqa: E402

VALUE = os.urandom(1024)


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def metric(proc: TesseraProc, name: str) -> float:
    status, body = proc.request("GET", "/metrics")
    if status != 200:
        return 0.0
    m = re.search(rf"^{name} (\S+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def create(proc: TesseraProc, topic: str, partitions: int, config: dict):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": proc.bootstrap})
    a.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)
    time.sleep(0.5)


def fill(proc: TesseraProc, topic: str, records: int, keys: int):
    p = Producer({"bootstrap.servers": proc.bootstrap, "acks": "all", "linger.ms": 5,
                  "queue.buffering.max.messages": 500_000, "batch.size": 1 << 20})
    for i in range(records):
        while True:
            try:
                p.produce(topic, key=f"key-{i % keys}".encode(), value=VALUE)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(300) == 0


class Probe:
    """Sends records at a fixed rate in a thread; latencies in ms."""

    def __init__(self, proc: TesseraProc, topic: str, rate: int):
        self.p = Producer({"bootstrap.servers": proc.bootstrap, "acks": "all", "linger.ms": 0})
        self.topic, self.rate = topic, rate
        self.lat: list[float] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        i = 0
        start = time.monotonic()
        while not self.stop.is_set():
            due = start + i / self.rate
            now = time.monotonic()
            if due > now:
                time.sleep(min(due - now, 0.01))
                continue
            sent = time.monotonic()
            self.p.produce(self.topic, key=str(i).encode(), value=VALUE,
                           on_delivery=lambda err, _m, s=sent: err is None and self.lat.append(
                               (time.monotonic() - s) * 1000))
            self.p.poll(0)
            i += 1
        self.p.flush(30)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.t.join()


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_on(binary: Path, data: Path, overrides: dict) -> TesseraProc:
    proc = TesseraProc(binary, overrides, prefix="bench-compaction-")
    shutil.copytree(data, proc.data)
    proc.start()
    return proc


def cleaner_run(binary: Path, data: Path, io_limit: float | None, rate: int) -> dict:
    overrides = {"log.cleaner.backoff.ms": "1000"}
    if io_limit:
        overrides["log.cleaner.io.max.bytes.per.second"] = str(io_limit)
    proc = start_on(binary, data, overrides)
    try:
        samples = []
        with Probe(proc, "probe", rate) as probe:
            t0 = time.monotonic()
            quiet_since = None
            last = -1.0
            while time.monotonic() - t0 < 600:
                read = metric(proc, "tessera_cleaner_io_bytes_total")
                samples.append((time.monotonic() - t0, read))
                if read > 0 and read == last:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 3:
                        break
                else:
                    quiet_since = None
                last = read
                time.sleep(0.25)
        moving = [t for (t, b), (_, b0) in zip(samples[1:], samples) if b > b0]
        first = next(t for t, b in samples if b > 0) if any(b > 0 for _, b in samples) else 0
        began = max(0.0, first - 0.25)
        ended = max(moving) if moving else began
        total = samples[-1][1]
        during = probe.lat
        return {
            "io_limit": io_limit,
            "read_bytes": total,
            "seconds": ended - began,
            "mb_per_s": total / max(ended - began, 1e-3) / 1e6,
            "before_bytes": metric(proc, "tessera_cleaner_cleaned_bytes_total"),
            "after_bytes": metric(proc, "tessera_cleaner_kept_bytes_total"),
            "probe_p50_ms": pct(during, 0.5),
            "probe_p99_ms": pct(during, 0.99),
            "probe_records": len(during),
        }
    finally:
        proc.stop()


def steady(binary: Path, policy: str, seconds: int, rate: int) -> list[tuple[float, int]]:
    proc = TesseraProc(binary, {"log.retention.check.interval.ms": "1000",
                                "log.cleaner.backoff.ms": "1000"}, prefix="bench-steady-")
    proc.start()
    try:
        config = {"cleanup.policy": policy, "segment.bytes": str(1 << 20)}
        if policy == "delete":
            config["retention.ms"] = "10000"
        else:
            config["min.cleanable.dirty.ratio"] = "0.1"
        create(proc, "steady", 3, config)
        p = Producer({"bootstrap.servers": proc.bootstrap, "acks": "all", "linger.ms": 5})
        series = []
        t0 = time.monotonic()
        i = 0
        next_sample = 0.0
        while True:
            now = time.monotonic() - t0
            if now >= next_sample:
                series.append((round(now, 1), dir_bytes(proc.data)))
                next_sample += 1.0
            if now > seconds:
                break
            while i < now * rate:
                p.produce("steady", key=f"key-{i % 1000}".encode(), value=VALUE)
                i += 1
            p.poll(0)
            time.sleep(0.005)
        p.flush(60)
        return series
    finally:
        proc.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=2_000)
    ap.add_argument("--io-limit", type=float, default=20e6)
    ap.add_argument("--probe-rate", type=int, default=500)
    ap.add_argument("--steady-s", type=int, default=60)
    ap.add_argument("--steady-rate", type=int, default=2_000)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args()
    binary = Path(os.environ.get("TESSERA_BIN", "target/release/tessera"))

    log(f"filling a compacted topic: {args.records} x 1 KiB over {args.keys} keys")
    base = TesseraProc(binary, {"log.cleaner.enable": "false"}, prefix="bench-compaction-")
    base.start()
    create(base, "compacted", 3, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
                                  "min.cleanable.dirty.ratio": "0.01"})
    create(base, "probe", 1, {})
    fill(base, "compacted", args.records, args.keys)
    # One more record after a pause rolls nothing by itself; the active
    # segment (the last MiB) simply stays uncleaned.
    filled = dir_bytes(base.data)
    log(f"filled: {filled / 1e6:.1f} MB on disk; baseline probe")
    with Probe(base, "probe", args.probe_rate) as probe:
        time.sleep(15)
    baseline = {"probe_p50_ms": pct(probe.lat, 0.5), "probe_p99_ms": pct(probe.lat, 0.99),
                "probe_records": len(probe.lat)}
    base.stop(keep=True)
    data = base.data

    runs = []
    for limit in (None, args.io_limit):
        log(f"cleaning with io limit {limit or 'none'}")
        runs.append(cleaner_run(binary, data, limit, args.probe_rate))
        log(json.dumps(runs[-1]))
    shutil.rmtree(base.workdir, ignore_errors=True)

    series = {}
    for policy in ("delete", "compact"):
        log(f"steady load, cleanup.policy={policy}, {args.steady_s} s")
        series[policy] = steady(binary, policy, args.steady_s, args.steady_rate)

    out = {"records": args.records, "keys": args.keys, "filled_bytes": filled, "baseline": baseline,
           "runs": runs, "steady_rate": args.steady_rate, "steady": series}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"Compacted topic: {args.records:,} records of 1 KiB over {args.keys:,} keys, "
          f"3 partitions, segment.bytes 1 MiB ({filled / 1e6:.0f} MB on disk).\n")
    print("| cleaner | cleaner MB/s (read+write) | pass s | segments before -> after (MB) "
          "| probe p50 ms | probe p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| off (baseline) | - | - | - | {baseline['probe_p50_ms']:.1f} | {baseline['probe_p99_ms']:.1f} |")
    for r in runs:
        name = "unthrottled" if not r["io_limit"] else f"io.max {r['io_limit'] / 1e6:.0f} MB/s"
        print(f"| {name} | {r['mb_per_s']:.1f} | {r['seconds']:.1f} | "
              f"{r['before_bytes'] / 1e6:.0f} -> {r['after_bytes'] / 1e6:.1f} | "
              f"{r['probe_p50_ms']:.1f} | {r['probe_p99_ms']:.1f} |")
    print(f"\nSteady load, {args.steady_rate} records/s of 1 KiB: data directory size (MB)\n")
    print("| t (s) | " + " | ".join(series) + " |")
    print("|---:|" + "---:|" * len(series))
    for i in range(0, max(len(s) for s in series.values()), 10):
        row = [f"{series[k][i][1] / 1e6:.1f}" if i < len(series[k]) else "" for k in series]
        t = next(series[k][i][0] for k in series if i < len(series[k]))
        print(f"| {t:.0f} | " + " | ".join(row) + " |")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = {"delete": "cleanup.policy=delete, retention.ms=10s", "compact": "cleanup.policy=compact, 1,000 keys"}
        for k, s in series.items():
            ax.plot([t for t, _ in s], [b / 1e6 for _, b in s], label=labels[k])
        ax.set_xlabel("seconds")
        ax.set_ylabel("data directory (MB)")
        ax.set_title(f"Disk use under {args.steady_rate} records/s x 1 KiB "
                     f"({args.steady_rate * 1024 / 1e6:.1f} MB/s)")
        ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)


if __name__ == "__main__":
    main()
