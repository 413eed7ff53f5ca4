#!/usr/bin/env python3
"""Range-moves benchmark: what splits and merges during a run cost produce
throughput and latency.

For each mode, on a fresh tessera (release binary, data on disk) with one
32-partition topic, confluent-kafka producer(s) (acks=all, idempotent,
linger.ms=5, 1 KiB values, record i to partition i % 32) send N records flat
out (default 200,000); median of R runs (default 3), the modes interleaved so
a noisy machine hits them alike:

  a. no moves: `range.policy.enable=false`, the topic stays one range;
  b. forced moves: policy off, and a thread splits and merges the topic's
     ranges through the admin HTTP API every --move-ms (default 100 ms) for
     the whole run: the widest range split until 8-16 ranges, adjacent pairs
     merged down to 1-2, again (the stress test's pattern);
  c. automatic policy with low thresholds (`range.policy.interval.ms`,
     `range.split.bytes.per.sec`, ... from the command line), so it splits
     under this load and merges when the load stops;
  d. reference for (b): policy off, the topic split to --static-ranges
     (default 8) ranges before the run, no moves during it. Moves change
     the layout too, and more ranges append in parallel: (b) against (d)
     separates the cost of moving from the gain of having more ranges.

Reports records/s, MB/s, p50/p99 latency (send -> delivery callback, which
includes client-side queueing at saturation and the retries after
NOT_LEADER_OR_FOLLOWER), the moves done, and ratios against (a), as markdown
on stdout; progress on stderr; raw JSON with --json. Not a test:
bench/range_moves.sh (scripts/test.sh does not run it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import create_topic  # noqa: E402
import procguard  # noqa: E402  (on sys.path through bench)
from tessera_proc import TesseraProc  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECORD_SIZE = 1024
MB = 1_000_000
MODES = {
    "a": "no moves (policy off)",
    "b": "forced split/merge every {move_ms} ms",
    "c": "automatic policy, low thresholds",
    "d": "static {static} ranges, no moves",
}


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


class Tessera(TesseraProc):
    def __init__(self, binary: Path, overrides: dict[str, str]):
        super().__init__(binary, overrides, prefix="bench-moves-")

    # (status, body): a move that lost a race answers 4xx, which is counted.
    http = TesseraProc.request

    def moves(self, topic: str) -> tuple[int, int]:
        """(splits, merges) the topic has seen, from its ranges' lineage."""
        rs = self.ranges(topic)
        return (sum(1 for r in rs if len(r["parents"]) == 1) // 2,
                sum(1 for r in rs if len(r["parents"]) == 2))


class Mover:
    """Split the widest range until 8-16 ranges, merge adjacent pairs down to 1-2, repeat."""

    def __init__(self, b: Tessera, topic: str, interval_s: float, seed: int):
        self.b, self.topic, self.interval = b, topic, interval_s
        self.rnd = random.Random(seed)
        self.stop = threading.Event()
        self.done = self.refused = self.failed = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        splitting, goal = True, self.rnd.randint(8, 16)
        while not self.stop.wait(self.interval):
            try:
                ranges = self.b.active_ranges(self.topic)
                if splitting and len(ranges) >= goal:
                    splitting, goal = False, self.rnd.randint(1, 2)
                elif not splitting and len(ranges) <= goal:
                    splitting, goal = True, self.rnd.randint(8, 16)
                if splitting:
                    widest = max(ranges, key=lambda r: r["hi"] - r["lo"])
                    status, _ = self.b.http("POST", f"/ranges/split?range={widest['id']}")
                else:
                    i = self.rnd.randrange(len(ranges) - 1)
                    status, _ = self.b.http(
                        "POST", f"/ranges/merge?left={ranges[i]['id']}&right={ranges[i + 1]['id']}")
            except OSError:
                self.failed += 1
                continue
            if status == 200:
                self.done += 1
            elif 400 <= status < 500:
                self.refused += 1
            else:
                self.failed += 1


def produce_flat_out(bootstrap: str, topic: str, n: int, producers: int, partitions: int,
                     pool: list[bytes], max_s: float) -> dict:
    """`producers` Producer instances, one thread each, n records in total."""
    shares = [n // producers + (1 if k < n % producers else 0) for k in range(producers)]
    lat: list[float] = []
    counts = {"delivered": 0, "errors": 0, "undelivered": 0}
    lock = threading.Lock()
    t0 = time.perf_counter()
    deadline = t0 + max_s

    def one(k: int, count: int):
        p = Producer({
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 1_048_576,
        })
        sent_at = [0.0] * count
        my_lat = []
        ok, bad = [0], [0]

        def cb(err, msg):
            now = time.perf_counter()
            if err is not None:
                bad[0] += 1
                return
            ok[0] += 1
            my_lat.append(now - sent_at[int.from_bytes(msg.value()[:8], "big")])

        i = 0
        while i < count and time.perf_counter() < deadline:
            v = i.to_bytes(8, "big") + pool[i % len(pool)]
            sent_at[i] = time.perf_counter()
            try:
                p.produce(topic, value=v, partition=(i * producers + k) % partitions, on_delivery=cb)
                i += 1
            except BufferError:
                p.poll(0.01)
                continue
            if i % 1000 == 0:
                p.poll(0)
        left = p.flush(max(5.0, deadline - time.perf_counter() + 30))
        with lock:
            lat.extend(my_lat)
            counts["delivered"] += ok[0]
            counts["errors"] += bad[0]
            counts["undelivered"] += left

    threads = [threading.Thread(target=one, args=(k, c)) for k, c in enumerate(shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    lat.sort()
    done = counts["delivered"]
    return {
        "records": done, "errors": counts["errors"], "undelivered": counts["undelivered"], "seconds": elapsed,
        "rps": done / elapsed, "mbps": done * RECORD_SIZE / MB / elapsed,
        "p50_ms": 1000 * lat[len(lat) // 2] if lat else float("nan"),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
        "complete": done == n,
    }


def policy_overrides(args) -> dict[str, str]:
    return {
        "range.policy.enable": "true",
        "range.policy.interval.ms": str(args.policy_interval_ms),
        "range.policy.sustain.intervals": str(args.sustain),
        "range.split.bytes.per.sec": str(args.split_bytes),
        "range.merge.bytes.per.sec": str(args.merge_bytes),
        "range.min.count": "1",
        "range.max.count": str(args.max_count),
    }


def run_one(mode: str, args, pool: list[bytes], seed: int) -> dict:
    overrides = policy_overrides(args) if mode == "c" else {"range.policy.enable": "false"}
    b = Tessera(Path(args.tessera_bin), overrides)
    try:
        b.start()
        create_topic(b.bootstrap, "warmup", args.partitions)
        produce_flat_out(b.bootstrap, "warmup", 5_000, 1, args.partitions, pool, 30)
        topic = "moves"
        create_topic(b.bootstrap, topic, args.partitions)
        if mode == "d":
            while len(active := b.active_ranges(topic)) < args.static_ranges:
                widest = max(active, key=lambda r: r["hi"] - r["lo"])
                status, body = b.http("POST", f"/ranges/split?range={widest['id']}")
                if status != 200:
                    raise RuntimeError(f"split {widest['id']} -> {status} {body}")
        before = b.moves(topic)
        mover = Mover(b, topic, args.move_ms / 1000, seed) if mode == "b" else None
        if mover:
            mover.thread.start()
        r = produce_flat_out(b.bootstrap, topic, args.records, args.producers, args.partitions, pool,
                             args.max_seconds)
        if mover:
            mover.stop.set()
            mover.thread.join(60)
            r["refused"], r["failed_moves"] = mover.refused, mover.failed
        after = b.moves(topic)
        r["splits"], r["merges"] = after[0] - before[0], after[1] - before[1]
        r["ranges_at_end"] = len(b.active_ranges(topic))
        return r
    except Exception as e:  # noqa: BLE001 - a broken broker is a result too
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        b.stop()


def median_of(runs: list[dict]) -> dict:
    bad = [r for r in runs if "error" in r]
    if bad:
        return bad[0]
    out = {"runs": len(runs)}
    for k, v in runs[0].items():
        vals = [r.get(k) for r in runs]
        if isinstance(v, bool):
            out[k] = all(vals)
        elif isinstance(v, (int, float)) and all(isinstance(x, (int, float)) for x in vals):
            out[k] = statistics.median(vals)
        else:
            out[k] = v
    return out


def fmt(x, spec=",.0f"):
    return "n/a" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def markdown(results: dict, args) -> str:
    lines = [
        f"### Produce with range moves, {args.records:,} x 1 KiB records, {args.partitions} partitions, "
        f"{args.producers} idempotent confluent-kafka producer(s), acks=all, linger.ms=5, "
        f"median of {args.repeat} runs",
        "",
        "| mode | records/s | MB/s | p50 ms | p99 ms | rec/s vs (a) | p99 vs (a) | splits | merges | "
        "ranges at end | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = results.get("a")
    for mode, r in results.items():
        name = f"({mode}) " + MODES[mode].format(move_ms=args.move_ms, static=args.static_ranges)
        if "error" in r:
            lines.append(f"| {name} | | | | | | | | | | FAILED: {r['error'][:80]} |")
            continue
        note = []
        if not r["complete"]:
            note.append(f"incomplete: {r['records']:,} delivered, {r['errors']} errors, "
                        f"{r['undelivered']} undelivered")
        elif r["errors"]:
            note.append(f"{r['errors']} delivery errors")
        if r.get("refused"):
            note.append(f"{r['refused']:.0f} moves refused")
        if r.get("failed_moves"):
            note.append(f"{r['failed_moves']:.0f} moves failed")
        ok_base = base is not None and "error" not in base

        def ratio(key):
            return f"{r[key] / base[key]:.2f}x" if ok_base and base[key] else "n/a"
        lines.append(
            f"| {name} | {fmt(r['rps'])} | {fmt(r['mbps'], '.1f')} | {fmt(r['p50_ms'], '.1f')} | "
            f"{fmt(r['p99_ms'], '.1f')} | {ratio('rps')} | {ratio('p99_ms')} | {fmt(r['splits'])} | "
            f"{fmt(r['merges'])} | {fmt(r['ranges_at_end'])} | {'; '.join(note)} |")
    pol = policy_overrides(args)
    durations = ", ".join(f"({m}) {r['seconds']:.1f} s" for m, r in results.items() if "error" not in r)
    lines += ["", f"Run length (median): {durations}. A run of a few seconds sees few forced moves "
              f"(one per {args.move_ms} ms at best); raise --records for longer runs."]
    lines += ["", "p50/p99: send -> delivery callback while producing flat out (includes client-side "
              "queueing and the retries after NOT_LEADER_OR_FOLLOWER). Splits/merges: moves of the topic "
              "during the run (medians), from its ranges' lineage. (c) runs with "
              + ", ".join(f"`{k}={v}`" for k, v in pol.items() if k != "range.policy.enable")
              + f". {os.cpu_count()} cores, client and broker on the same host."]
    return "\n".join(lines)


def main():
    procguard.install_sigterm_handler()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode; the table shows medians")
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--producers", type=int, default=1, help="Producer instances (one thread each)")
    ap.add_argument("--modes", default="a,b,c,d")
    ap.add_argument("--static-ranges", type=int, default=8, help="(d): ranges split to before the run")
    ap.add_argument("--move-ms", type=int, default=100, help="(b): pause between forced moves")
    ap.add_argument("--policy-interval-ms", type=int, default=100, help="(c): range.policy.interval.ms")
    ap.add_argument("--sustain", type=int, default=2,
                    help="(c): range.policy.sustain.intervals (1 lets a just-split pair, which has no rate sample yet, look cold and merge back)")
    ap.add_argument("--split-bytes", type=int, default=4 << 20, help="(c): range.split.bytes.per.sec")
    ap.add_argument("--merge-bytes", type=int, default=1 << 20, help="(c): range.merge.bytes.per.sec")
    ap.add_argument("--max-count", type=int, default=16, help="(c): range.max.count")
    ap.add_argument("--max-seconds", type=float, default=120, help="time cap per produce run")
    ap.add_argument("--seed", type=int, default=12, help="(b): the mover's random choices")
    ap.add_argument("--tessera-bin", default=os.environ.get("TESSERA_BIN", str(REPO / "target/release/tessera")))
    ap.add_argument("--json", help="also write raw results here")
    args = ap.parse_args()
    if not Path(args.tessera_bin).exists():
        sys.exit(f"tessera binary not found: {args.tessera_bin} (cargo build --release -p tessera-gateway)")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            sys.exit(f"unknown mode {m!r} (a, b, c, d)")
    rnd = random.Random(7)
    pool = [rnd.randbytes(RECORD_SIZE - 8) for _ in range(256)]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(args.repeat):
        for m in modes:  # interleaved: a b c a b c ...
            r = run_one(m, args, pool, args.seed + rep)
            runs[m].append(r)
            if "error" in r:
                log(f"  run {rep + 1} ({m}): FAILED {r['error']}")
            else:
                log(f"  run {rep + 1} ({m}): {r['rps']:,.0f} rec/s, p99 {r['p99_ms']:.0f} ms, "
                    f"{r['splits']} splits, {r['merges']} merges, {r['errors']} errors, "
                    f"{r['seconds']:.1f} s")
    results = {m: median_of(rs) for m, rs in runs.items()}
    out = {"date": datetime.date.today().isoformat(), "args": vars(args), "cpus": os.cpu_count(),
           "loadavg_before": load_before, "median": results, "runs": runs,
           "seconds": time.monotonic() - started}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    print(f"## Range moves ({out['date']}, {os.cpu_count()} cores, load average before the run "
          f"{load_before:.2f})\n")
    print(markdown(results, args))
    print(f"\n(benchmark wall time {out['seconds']:.0f} s)")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
