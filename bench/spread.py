#!/usr/bin/env python3
"""Spread primaries on a local 3-node cluster (issue 23): produce to one
12-partition topic, replication factor 3, `min.insync.replicas=2`, led by
one broker (a manual assignment of every partition to [1, 2, 3]: one range,
as every topic was before creation spread it) against the same topic as
creation places it now (one range per broker, each led by another), runs
alternating, median of R. confluent-kafka, acks=all, idempotent,
linger.ms=5, 1 KiB values, N records flat out (latency includes
client-side queueing at saturation).

Markdown on stdout, progress on stderr. Not a test: bench/spread.sh.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat-tests" / "python"))
from replication import flat_out, log, start_cluster, stop_cluster  # noqa: E402

PARTITIONS = 12


def create(admin: AdminClient, name: str, one_primary: bool) -> Counter:
    spec = (NewTopic(name, PARTITIONS, replica_assignment=[[1, 2, 3]] * PARTITIONS,
                     config={"min.insync.replicas": "2"}) if one_primary
            else NewTopic(name, PARTITIONS, 3, config={"min.insync.replicas": "2"}))
    admin.create_topics([spec])[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if t and t.error is None and all(p.leader > 0 for p in t.partitions.values()):
            return Counter(p.leader for p in t.partitions.values())
        time.sleep(0.2)
    raise RuntimeError("topic not ready")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    binary = os.path.abspath(os.environ.get("TESSERA_BIN", "target/release/tessera"))
    proc, workdir, boot = start_cluster(binary)
    try:
        admin = AdminClient({"bootstrap.servers": boot})
        leaders = {"one-primary": create(admin, "one-primary", True),
                   "spread": create(admin, "spread", False)}
        log(f"leaders: {leaders}")
        runs = {"one-primary": [], "spread": []}
        for r in range(args.repeat):
            for topic in ("one-primary", "spread"):
                res = flat_out(boot, topic, args.records)
                log(f"run {r + 1} {topic}: {res}")
                runs[topic].append(res)
        med = {t: {k: statistics.median(x[k] for x in v) for k in v[0]} for t, v in runs.items()}
    finally:
        stop_cluster(proc, workdir)
    print(f"Spread primaries, 3 nodes on one machine, {PARTITIONS} partitions RF=3, "
          f"{args.records} x 1 KiB, acks=all, median of {args.repeat}\n")
    print("| topic | partitions led per broker | records/s | MB/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for t in ("one-primary", "spread"):
        m = med[t]
        led = ", ".join(f"{b}: {n}" for b, n in sorted(leaders[t].items()))
        print(f"| {t} | {led} | {m['rps']:.0f} | {m['mbps']:.1f} | {m['p50']:.1f} | {m['p99']:.1f} "
              f"| {m['errors']:.0f} |")
    print(f"\nspread / one primary: throughput {med['spread']['rps'] / med['one-primary']['rps']:.2f}x, "
          f"p99 {med['spread']['p99'] / med['one-primary']['p99']:.2f}x")


if __name__ == "__main__":
    main()
