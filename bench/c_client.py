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
    bench/c_client.sh --brokers tessera,cluster --replication-factor 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BrokerProc, create_topic, free_port, procguard, tansu_binary, terminate_then_kill  # noqa: E402

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


class ClusterProc:
    """`tessera cluster --nodes 3` (three processes, one data dir each) on
    free loopback ports, ready once every node's /ready answers 200."""

    def __init__(self, binary: Path, nodes: int = 3):
        self.binary, self.nodes = binary, nodes
        self.ports = [free_port() for _ in range(3)]
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        self.log = open(self.workdir / "cluster.log", "wb")
        self.proc = None

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[0] + i}" for i in range(self.nodes))

    def start(self):
        # The cluster command takes a base port per kind and counts up from
        # it: pick bases whose whole blocks are free.
        while True:
            bases = [free_port() for _ in range(3)]
            apart = all(abs(a - b) >= self.nodes for a in bases for b in bases if a != b)
            if apart and len(set(bases)) == 3 and all(self._block_free(b) for b in bases):
                break
        self.ports = bases
        cmd = [str(self.binary), "cluster", "--nodes", str(self.nodes), "--base-port", str(bases[0]),
               "--admin-base-port", str(bases[1]), "--controller-base-port", str(bases[2]),
               "--dir", str(self.workdir / "data")]
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        self.proc = procguard.spawn(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL,
                                    cwd=self.workdir, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cluster exited {self.proc.returncode}; log: {self.log.name}")
            if all(self._ready(bases[1] + i) for i in range(self.nodes)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"cluster not ready in 60 s; log: {self.log.name}")

    def _block_free(self, base: int) -> bool:
        import socket
        for port in range(base, base + self.nodes):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    return False
        return True

    @staticmethod
    def _ready(admin_port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self):
        terminate_then_kill(self.proc, 30)
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def create_replicated_topic(bootstrap: str, topic: str, partitions: int, rf: int):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"min.insync.replicas": "2"} if rf >= 3 else {}
    admin.create_topics([NewTopic(topic, partitions, rf, config=config)])[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if t and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {topic} not ready")


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
            timeout: float, drop_caches: bool, rf: int) -> dict:
    broker = ClusterProc(binary) if kind == "cluster" else BrokerProc(kind, binary)
    try:
        broker.start()
        topic = f"bench-c-{codec}"
        if kind == "cluster":
            create_replicated_topic(broker.bootstrap, topic, partitions, rf)
        else:
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
    kinds = [k for k in ("tessera", "cluster", "tansu") if any(r["broker"] == k for r in runs)]
    for codec in codecs:
        for kind in kinds:
            cell = [r for r in runs if r["broker"] == kind and r["codec"] == codec]
            each = ", ".join(f"{r['produce_rps']:,}" if "produce_rps" in r else "error" for r in cell)
            p, c, mb = (median(cell, k) for k in ("produce_rps", "consume_rps", "consume_mbps"))
            fmt = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
            lines.append(f"| {kind} | {codec} | {fmt(p)} | {fmt(c)} | {'-' if mb is None else mb} | {each} |")
    pairs = [(a, b) for a, b in (("tessera", "tansu"), ("cluster", "tessera"), ("cluster", "tansu"))
             if a in kinds and b in kinds]
    for a, b in pairs:
        lines += ["", f"| codec | produce {a}/{b} | consume {a}/{b} |", "|---|---:|---:|"]
        for codec in codecs:
            ratio = []
            for key in ("produce_rps", "consume_rps"):
                t = median([r for r in runs if r["broker"] == a and r["codec"] == codec], key)
                u = median([r for r in runs if r["broker"] == b and r["codec"] == codec], key)
                ratio.append(f"{t / u:.2f}x" if t and u else "-")
            lines.append(f"| {codec} | {ratio[0]} | {ratio[1]} |")
    lines += ["", "tessera stores on disk and acknowledges acks=-1 after fsync; tansu uses memory:// "
              "storage. Client and broker share the machine's cores."]
    if "cluster" in kinds:
        lines.append(f"cluster: `tessera cluster --nodes 3` on the same machine, the topic at replication "
                     f"factor {args.replication_factor}"
                     + (" with min.insync.replicas=2." if args.replication_factor >= 3 else "."))
    return "\n".join(lines)


def main() -> int:
    procguard.install_sigterm_handler()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="rdkafka_performance binary")
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--codecs", default="none,lz4")
    ap.add_argument("--brokers", default="tessera,tansu",
                    help="any of tessera (one node), cluster (tessera cluster --nodes 3), tansu")
    ap.add_argument("--replication-factor", type=int, default=1, help="of the cluster's topic")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per produce / consume")
    ap.add_argument("--tessera-bin", default=os.environ.get("TESSERA_BIN"))
    ap.add_argument("--tansu-bin", default=os.environ.get("TANSU_BIN"))
    ap.add_argument("--json", help="also write every run here")
    ap.add_argument("--keep-caches", action="store_true",
                    help="do not drop the page cache before each run (see settle_page_cache)")
    args = ap.parse_args()

    bins = {"tessera": Path(args.tessera_bin), "cluster": Path(args.tessera_bin)} if args.tessera_bin else {}
    if tansu := tansu_binary(args.tansu_bin):
        bins["tansu"] = tansu
    kinds = [k for k in args.brokers.split(",") if k in bins and bins[k].exists()]
    runs = []
    for round_ in range(args.rounds):
        for codec in args.codecs.split(","):
            # Alternate the order, so no broker always runs on the machine
            # another just warmed (or filled with dirty pages).
            order = kinds if round_ % 2 == 0 else list(reversed(kinds))
            for kind in order:
                r = run_one(kind, bins[kind], Path(args.tool), codec, args.records,
                            args.partitions, args.timeout, not args.keep_caches,
                            args.replication_factor)
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
