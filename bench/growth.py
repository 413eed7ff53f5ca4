#!/usr/bin/env python3
"""How cost grows (issue 28): one tessera node's produce and consume rate
and its latency as functions of partitions, of producer connections, of
record size and of the number of ranges, plus memory per partition and per
connection. Tables on stdout (markdown), raw JSON with --json, a plot with
--png.

Each point starts a fresh broker (range policy off: only this script
splits), creates the topic, settles the page cache (see c_client.py), then:

- throughput: librdkafka's `rdkafka_performance` produces flat out (acks=-1,
  linger.ms=5, the default partitioner spreading records over every
  partition) and consumes everything back from the beginning;
- latency: `compat-tests/examples/latency.rs` (librdkafka through the
  rdkafka crate, HdrHistogram) at a fixed rate well below the maximum
  (`--latency-rate`, records/s; for the record-size sweep a fixed byte
  rate), produce and end-to-end p50/p99;
- memory: the broker's VmRSS before the topic, after creating it (idle)
  and, for the connection sweep, while the producers are connected.

Sweeps (each can be narrowed, e.g. `--partitions 1,100`):
  partitions   1, 10, 100, 1,000, 10,000 (1 KiB records)
  producers    1, 10, 100, 1,000 connections (one librdkafka producer each,
               one topic of 100 partitions, the same total rate; throughput
               from the latency driver flat out with that many producers)
  sizes        100 B, 1 KiB, 10 KiB, 100 KiB, 1 MiB (100 partitions, about
               the same bytes per run)
  ranges       1, 2, 4, 8, 16 ranges of one 100-partition topic

    bench/growth.sh [--quick] [--sweeps partitions,sizes] [--png docs/growth.png]

Not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import create_topic  # noqa: E402
from c_client import CONSUMED, PRODUCED, last_match, settle_page_cache  # noqa: E402
from tessera_proc import TesseraProc  # noqa: E402

MB = 1_000_000


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


class Broker(TesseraProc):
    def __init__(self, binary: Path):
        super().__init__(binary, {"range.policy.enable": "false",
                                  "message.max.bytes": str(2 << 20)}, prefix="bench-growth-")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def split_to(self, topic: str, count: int):
        while len(active := self.active_ranges(topic)) < count:
            widest = max(active, key=lambda r: r["hi"] - r["lo"])
            status, body = self.request("POST", f"/ranges/split?range={widest['id']}")
            if status != 200:
                raise RuntimeError(f"split -> {status} {body}")


def produce(tool: Path, bootstrap: str, topic: str, size: int, n: int, timeout: float) -> dict:
    cmd = [str(tool), "-P", "-t", topic, "-b", bootstrap, "-s", str(size), "-c", str(n),
           "-a", "-1", "-X", "linger.ms=5", "-X", f"message.max.bytes={2 << 20}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "produce timed out"}
    m = last_match(PRODUCED, out.stdout + out.stderr)
    if out.returncode != 0 or not m or int(m[0]) != n:
        return {"error": f"produce exited {out.returncode}: {(out.stdout + out.stderr)[-300:]}"}
    return {"produce_rps": int(m[2]), "produce_mbps": float(m[3]) * 1.048576}


def consume(tool: Path, bootstrap: str, topic: str, partitions: int, n: int, timeout: float) -> dict:
    # librdkafka's long poll (fetch.wait.max.ms 500) on the first partitions
    # whose offsets resolve, and its queue-full backoff (1 s), stalled
    # half-second runs for 0.5-1 s at random: short waits measure the broker.
    cmd = [str(tool), "-C", "-t", topic, "-b", bootstrap, "-o", "beginning", "-c", str(n),
           "-X", f"fetch.message.max.bytes={4 << 20}",
           "-X", "fetch.wait.max.ms=10", "-X", "fetch.queue.backoff.ms=10"]
    for p in range(partitions):
        cmd += ["-p", str(p)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "consume timed out"}
    m = last_match(CONSUMED, out.stdout + out.stderr)
    if not m or int(m[0]) < n:
        return {"error": f"consume exited {out.returncode}: {(out.stdout + out.stderr)[-300:]}"}
    return {"consume_rps": int(m[3]),
            "consume_mbps": round(int(m[1]) * 1000 / max(int(m[2]), 1) / MB, 1)}


def latency(driver: Path, bootstrap: str, topic: str, rate: int, size: int, producers: int,
            seconds: int, broker: Broker) -> dict:
    """The driver at `rate` records/s; the broker's peak RSS while it ran."""
    # 256 MiB of queue over all producers (librdkafka's default is 1 GiB
    # each: a thousand producers flat out would fill the machine).
    queue = max(512, (256 << 10) // producers)
    cmd = [str(driver), "--bootstrap", bootstrap, "--topic", topic, "--rate", str(rate),
           "--size", str(size), "--producers", str(producers), "--consumers", "1",
           "--linger-ms", "5", "--seconds", str(seconds), "--warmup", "3",
           "--queue-kbytes", str(queue)]
    peak = [0.0]
    done = threading.Event()

    def sample():
        while not done.wait(0.5):
            peak[0] = max(peak[0], broker.rss_mib())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 240)
    except subprocess.TimeoutExpired:
        return {"error": "latency driver timed out"}
    finally:
        done.set()
        t.join()
    try:
        r = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"driver exited {out.returncode}: {out.stderr[-300:]}"}
    return {"produce_p50_ms": r["produce"]["p50_ms"], "produce_p99_ms": r["produce"]["p99_ms"],
            "e2e_p50_ms": r["end_to_end"]["p50_ms"], "e2e_p99_ms": r["end_to_end"]["p99_ms"],
            "achieved_rps": r["produced_per_s"], "consumed_rps": r["consumed_per_s"],
            "rss_during_mib": round(peak[0], 1)}


def point(args, sweep: str, x: int, *, partitions: int, size: int, producers: int, ranges: int,
          records: int, rate: int) -> dict:
    b = Broker(args.binary)
    r = {"sweep": sweep, "x": x, "partitions": partitions, "size": size,
         "producers": producers, "ranges": ranges}
    try:
        b.start()
        r["rss_empty_mib"] = round(b.rss_mib(), 1)
        topic = "growth"
        create_topic(b.bootstrap, topic, partitions)
        if ranges > 1:
            b.split_to(topic, ranges)
        time.sleep(1)
        r["rss_idle_mib"] = round(b.rss_mib(), 1)
        if args.no_throughput:
            pass
        elif sweep == "producers":
            # Flat out with `producers` connections: the driver itself (one
            # rdkafka_performance is one connection).
            settle_page_cache(not args.keep_caches)
            flat = latency(args.driver, b.bootstrap, topic, 0, size, producers, 5, b)
            if "error" in flat:
                r["error"] = flat["error"]
            else:
                r["produce_rps"] = flat["achieved_rps"]
                r["produce_mbps"] = flat["achieved_rps"] * size / MB
                r["consume_rps"] = flat["consumed_rps"]
                r["consume_mbps"] = flat["consumed_rps"] * size / MB
        else:
            settle_page_cache(not args.keep_caches)
            r.update(produce(args.tool, b.bootstrap, topic, size, records, args.timeout))
            if "error" not in r:
                r.update(consume(args.tool, b.bootstrap, topic, partitions, records, args.timeout))
        lat_topic = "growth-latency"
        create_topic(b.bootstrap, lat_topic, partitions)
        if ranges > 1:
            b.split_to(lat_topic, ranges)
        r.update(latency(args.driver, b.bootstrap, lat_topic, rate, size, producers,
                         args.seconds, b))
    except Exception as e:  # a point that fails is reported, the sweep goes on
        r["error"] = str(e)[-300:]
    finally:
        b.stop()
    log(f"{sweep} {x}: {json.dumps(r)}")
    return r


def sweeps(args) -> list[dict]:
    out = []
    q = args.quick
    n1k = 100_000 if q else 400_000
    if "partitions" in args.sweeps:
        for p in args.partitions:
            out.append(point(args, "partitions", p, partitions=p, size=1024, producers=2, ranges=1,
                             records=n1k, rate=args.latency_rate))
    if "producers" in args.sweeps:
        for c in args.producers:
            out.append(point(args, "producers", c, partitions=100, size=1024, producers=c,
                             ranges=1, records=n1k, rate=args.latency_rate))
    if "sizes" in args.sweeps:
        total = (100 if q else 400) * MB
        for s in args.sizes:
            n = max(200, min(total // s, 2_000_000))
            rate = max(20, args.latency_bytes_per_sec // s)
            out.append(point(args, "sizes", s, partitions=100, size=s, producers=2, ranges=1,
                             records=n, rate=rate))
    if "ranges" in args.sweeps:
        for k in args.ranges:
            out.append(point(args, "ranges", k, partitions=100, size=1024, producers=2, ranges=k,
                             records=n1k, rate=args.latency_rate))
    return out


def cell(r: dict, key: str, spec: str = ",.0f") -> str:
    v = r.get(key)
    return "—" if v is None else format(v, spec)


def markdown(rows: list[dict], args) -> str:
    heads = {"partitions": "partitions", "producers": "producer connections",
             "sizes": "record size (bytes)", "ranges": "ranges (100 partitions)"}
    lines = [f"Latency at {args.latency_rate:,} records/s "
             f"(sizes: {args.latency_bytes_per_sec / MB:.0f} MB/s), linger.ms=5, acks=all; "
             f"throughput flat out with rdkafka_performance.", ""]
    for sweep, head in heads.items():
        rs = [r for r in rows if r["sweep"] == sweep]
        if not rs:
            continue
        lines += [f"#### By {head}", "",
                  f"| {head} | produce rec/s | produce MB/s | consume rec/s | consume MB/s "
                  "| produce p50 / p99 ms | end-to-end p50 / p99 ms | RSS empty / idle / under load MiB | note |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rs:
            lines.append(
                f"| {r['x']:,} | {cell(r, 'produce_rps')} | {cell(r, 'produce_mbps', '.0f')} "
                f"| {cell(r, 'consume_rps')} | {cell(r, 'consume_mbps', '.0f')} "
                f"| {cell(r, 'produce_p50_ms', '.1f')} / {cell(r, 'produce_p99_ms', '.1f')} "
                f"| {cell(r, 'e2e_p50_ms', '.1f')} / {cell(r, 'e2e_p99_ms', '.1f')} "
                f"| {cell(r, 'rss_empty_mib', '.0f')} / {cell(r, 'rss_idle_mib', '.0f')} / "
                f"{cell(r, 'rss_during_mib', '.0f')} | {r.get('error', '')[:80]} |")
        lines.append("")
    per_partition = [((r["rss_idle_mib"] - r["rss_empty_mib"]) * 1024 / r["x"], r["x"])
                     for r in rows if r["sweep"] == "partitions" and "rss_idle_mib" in r and r["x"] >= 100]
    if per_partition:
        lines.append("Memory per partition (idle topic, RSS after creation minus before): "
                     + ", ".join(f"{kib:.1f} KiB at {x:,}" for kib, x in per_partition) + ".")
    conns = [r for r in rows if r["sweep"] == "producers" and "rss_during_mib" in r]
    if len(conns) >= 2:
        lo, hi = conns[0], conns[-1]
        if hi["x"] > lo["x"]:
            kib = (hi["rss_during_mib"] - lo["rss_during_mib"]) * 1024 / (hi["x"] - lo["x"])
            lines.append(f"Memory per connection (peak RSS under load, {lo['x']:,} to {hi['x']:,} "
                         f"producers): {kib:.0f} KiB.")
    return "\n".join(lines)


def plot(rows: list[dict], path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sweeps_ = [("partitions", "partitions"), ("producers", "producer connections"),
               ("sizes", "record size (bytes)"), ("ranges", "ranges of a 100-partition topic")]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), squeeze=False)
    for col, (sweep, label) in enumerate(sweeps_):
        rs = [r for r in rows if r["sweep"] == sweep]
        top, bottom = axes[0, col], axes[1, col]
        if not rs:
            top.set_visible(False)
            bottom.set_visible(False)
            continue
        xs = [r["x"] for r in rs]
        for key, name in (("produce_mbps", "produce"), ("consume_mbps", "consume")):
            top.plot(xs, [r.get(key, float("nan")) for r in rs], marker="o", label=name)
        for key, name in (("produce_p99_ms", "produce p99"), ("e2e_p99_ms", "end-to-end p99")):
            bottom.plot(xs, [r.get(key, float("nan")) for r in rs], marker="o", label=name)
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.grid(True, which="both", linewidth=0.3)
        top.set_ylabel("MB/s (flat out)")
        bottom.set_ylabel("ms at a fixed rate")
        bottom.set_xlabel(label)
        top.legend(fontsize=8)
        bottom.legend(fontsize=8)
    fig.suptitle("tessera, one node: how cost grows (bench/growth.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", type=Path, required=True)
    p.add_argument("--tool", type=Path, required=True, help="rdkafka_performance")
    p.add_argument("--driver", type=Path, required=True, help="the latency driver")
    p.add_argument("--sweeps", default="partitions,producers,sizes,ranges")
    p.add_argument("--partitions", type=ints, default=[1, 10, 100, 1000, 10000])
    p.add_argument("--producers", type=ints, default=[1, 10, 100, 1000])
    p.add_argument("--sizes", type=ints, default=[100, 1024, 10240, 102400, 1048576])
    p.add_argument("--ranges", type=ints, default=[1, 2, 4, 8, 16])
    p.add_argument("--latency-rate", type=int, default=20_000)
    p.add_argument("--latency-bytes-per-sec", type=int, default=20 * MB)
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--quick", action="store_true", help="fewer records per point")
    p.add_argument("--no-throughput", action="store_true")
    p.add_argument("--keep-caches", action="store_true")
    p.add_argument("--json")
    p.add_argument("--png")
    args = p.parse_args()
    args.sweeps = args.sweeps.split(",")
    args.binary, args.tool, args.driver = (x.resolve() for x in (args.binary, args.tool, args.driver))
    rows = sweeps(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.png:
        plot(rows, args.png)
    print(markdown(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
