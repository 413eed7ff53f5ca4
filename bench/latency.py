#!/usr/bin/env python3
"""Latency the way the industry states it (issue 28): the OpenMessaging
Benchmark's Kafka workload shape (1 topic x 100 partitions, 1 KiB
records, 2 producers, a group of 2 consumers, acks=all) driven by
`compat-tests/examples/latency.rs` (librdkafka through the rdkafka crate,
HdrHistogram). Per broker and linger.ms: a flat-out run, a search for the
maximum sustainable rate (the highest whose consumers keep up with an
end-to-end p99 under 100 ms, five 5-second probes between 0 and the
flat-out rate), then runs at 50 % and 80 % of it report produce latency (send to
delivery report) and end-to-end latency (send to a consumer's receipt),
p50 / p99 / p99.9. Brokers: tessera (one node), cluster (`tessera
cluster --nodes 3`, the topic at RF=3, min.insync.replicas=2), tansu
(memory storage). Markdown on stdout. Not a test: bench/latency.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BrokerProc, create_topic, procguard, tansu_binary  # noqa: E402
from c_client import ClusterProc, create_replicated_topic, settle_page_cache  # noqa: E402


def drive(driver: Path, bootstrap: str, topic: str, rate: int, linger: int, seconds: int,
          warmup: int) -> dict:
    cmd = [str(driver), "--bootstrap", bootstrap, "--topic", topic, "--rate", str(rate),
           "--linger-ms", str(linger), "--seconds", str(seconds), "--warmup", str(warmup)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=warmup + seconds + 180)
    except subprocess.TimeoutExpired as e:
        return {"error": f"driver timed out: {(e.stderr or b'')[-400:]!r}"}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"driver exited {out.returncode}: {out.stderr[-400:]}"}


# A probe of the rate search keeps up when its consumers received what was
# produced and its end-to-end p99 stayed below this.
KEEPS_UP_P99_MS = 100.0
SEARCH_STEPS = 5
SEARCH_SECONDS, SEARCH_WARMUP = 5, 3


def keeps_up(r: dict, rate: int) -> bool:
    return ("error" not in r and r["produced_per_s"] >= 0.98 * rate
            and r["consumed_per_s"] >= 0.99 * r["produced_per_s"]
            and r["end_to_end"]["p99_ms"] < KEEPS_UP_P99_MS)


def run_broker(kind: str, binary: Path, driver: Path, lingers: list[int], seconds: int,
               warmup: int) -> list[dict]:
    broker = ClusterProc(binary) if kind == "cluster" else BrokerProc(kind, binary)
    rows = []

    def run(topic: str, rate: int, linger: int, secs: int, warm: int) -> dict:
        if kind == "cluster":
            create_replicated_topic(broker.bootstrap, topic, 100, 3)
        else:
            create_topic(broker.bootstrap, topic, 100)
        settle_page_cache(True)
        return drive(driver, broker.bootstrap, topic, rate, linger, secs, warm)

    try:
        broker.start()
        for linger in lingers:
            flat = run(f"latency-{linger}-max", 0, linger, seconds, warmup)
            flat.update({"broker": kind, "linger_ms": linger, "load": "max"})
            print(json.dumps(flat), file=sys.stderr, flush=True)
            rows.append(flat)
            # The flat-out run fills every batch; paced sends make smaller
            # ones that cost more per record. The maximum sustainable rate
            # is searched for, as OMB's rate controller does: the highest
            # rate whose consumers keep up with a bounded end-to-end p99.
            lo, hi = 0, int(flat.get("produced_per_s", 0))
            for step in range(SEARCH_STEPS):
                mid = (lo + hi) // 2
                probe = run(f"latency-{linger}-search-{step}", max(mid, 1000), linger,
                            SEARCH_SECONDS, SEARCH_WARMUP)
                ok = keeps_up(probe, max(mid, 1000))
                print(json.dumps({"broker": kind, "linger_ms": linger, "probe": mid, "keeps_up": ok}),
                      file=sys.stderr, flush=True)
                lo, hi = (mid, hi) if ok else (lo, mid)
            sustained = max(lo, 1000)
            for name, share in (("50%", 0.5), ("80%", 0.8)):
                r = run(f"latency-{linger}-{name.rstrip('%')}", int(sustained * share), linger,
                        seconds, warmup)
                r.update({"broker": kind, "linger_ms": linger, "load": name, "sustained_per_s": sustained})
                print(json.dumps(r), file=sys.stderr, flush=True)
                rows.append(r)
    finally:
        broker.stop()
    return rows


def markdown(rows: list[dict], seconds: int) -> str:
    lines = ["### Latency, 1 topic x 100 partitions, 1 KiB, 2 producers, 2 consumers (one group), "
             f"acks=all, {seconds} s measured per row", "",
             "| broker | linger.ms | load | target rec/s | produced rec/s | consumed rec/s "
             "| produce p50 / p99 / p99.9 ms | end-to-end p50 / p99 / p99.9 ms |",
             "|---|---:|---|---:|---:|---:|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['broker']} | {r['linger_ms']} | {r['load']} | error: {r['error'][:80]} |")
            continue
        p, e = r["produce"], r["end_to_end"]
        lines.append(
            f"| {r['broker']} | {r['linger_ms']} | {r['load']} | {r['target_per_s'] or 'flat out'} "
            f"| {r['produced_per_s']:,.0f} | {r['consumed_per_s']:,.0f} "
            f"| {p['p50_ms']:.2f} / {p['p99_ms']:.2f} / {p['p999_ms']:.2f} "
            f"| {e['p50_ms']:.2f} / {e['p99_ms']:.2f} / {e['p999_ms']:.2f} |")
    lines += ["", "Load: 50 % and 80 % of the maximum sustainable rate found by the search "
              f"(consumers keep up, end-to-end p99 under {KEEPS_UP_P99_MS:.0f} ms). "
              "Flat out: every queue full, so its latencies are queueing, not the broker's. "
              "A row whose consumed rate is below its produced rate did not keep up. "
              "tessera acknowledges after fsync (cluster: on 2 of 3 replicas); tansu keeps "
              "everything in memory. Producers, consumers and brokers share the machine's cores."]
    return "\n".join(lines)


def main() -> int:
    procguard.install_sigterm_handler()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--driver", required=True, help="the latency example's binary")
    ap.add_argument("--brokers", default="tessera,cluster,tansu")
    ap.add_argument("--lingers", default="0,5")
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tessera-bin", default=os.environ.get("TESSERA_BIN"))
    ap.add_argument("--tansu-bin", default=os.environ.get("TANSU_BIN"))
    ap.add_argument("--json", help="also write every run here")
    args = ap.parse_args()

    bins = {"tessera": Path(args.tessera_bin), "cluster": Path(args.tessera_bin)}
    if tansu := tansu_binary(args.tansu_bin):
        bins["tansu"] = tansu
    lingers = [int(x) for x in args.lingers.split(",")]
    rows = []
    for kind in args.brokers.split(","):
        if kind not in bins or not bins[kind].exists():
            print(f"skipping {kind}: binary not found", file=sys.stderr)
            continue
        rows += run_broker(kind, bins[kind], Path(args.driver), lingers, args.seconds, args.warmup)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(markdown(rows, args.seconds))
    return 0 if rows and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
