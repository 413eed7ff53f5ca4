#!/usr/bin/env python3
"""Ranges benchmark: what 10,000-partition topics cost tessera, and how produce
throughput to one moves as its range splits 1 -> 2 -> 4.

1. Footprint. A fresh broker: RSS (VmRSS) and the number of files under the
   data dir when empty, after creating a 10,000-partition topic, after writing
   one record to every partition, then the same for a second and third topic;
   then the first topic is split to 2 and 4 ranges (files follow the ranges'
   segments, not the partitions).
2. Throughput. A fresh broker, one 10,000-partition topic; confluent-kafka
   Producer, acks=all, linger.ms=5, 1 KiB values, random keys (every partition
   is hit); N records per run, median of R runs at 1, 2 and 4 ranges (split
   through the admin HTTP API between the groups of runs).
3. Bottleneck. During every run: broker CPU% (/proc/PID/stat), client CPU%
   (getrusage, includes librdkafka's threads), whole-machine busy and iowait
   (/proc/stat), fdatasync calls (perf stat, system-wide, when perf is
   usable), produce requests (/metrics); plus one perf profile of the whole
   machine during an extra 4-range run, broken down by thread name.

Markdown on stdout; progress on stderr; raw JSON with --json. Not a test:
bench/ranges.sh (scripts/test.sh does not run it). The broker runs with
range.policy.enable=false so only this script splits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
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
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


class Tessera(TesseraProc):
    """The broker with the range policy off: only the benchmark splits."""

    def __init__(self, binary: Path):
        super().__init__(binary, {"range.policy.enable": "false"}, prefix="bench-ranges-")

    def http(self, method: str, path: str, parse: bool = True):
        status, body = self.request(method, path)
        if status != 200:
            raise RuntimeError(f"{method} {path} -> {status} {body}")
        return json.loads(body) if parse else body

    def split_to(self, topic: str, count: int):
        """Split the topic's widest active range at its middle until it has `count` active ranges."""
        while len(active := self.active_ranges(topic)) < count:
            widest = max(active, key=lambda r: r["hi"] - r["lo"])
            self.http("POST", f"/ranges/split?range={widest['id']}")

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in self.http("GET", "/metrics", parse=False).splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def cpu_seconds(self) -> float:
        # fields after the ")" of comm: state is [0], utime [11], stime [12]
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / CLK_TCK

    def files(self, under: Path | None = None) -> int:
        return sum(len(fs) for _, _, fs in os.walk(under or self.data))


def machine_cpu() -> tuple[int, int, int]:
    """(total, idle, iowait) jiffies over all CPUs."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(f[:8]), f[3], f[4]


def client_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def perf_usable() -> bool:
    if not shutil.which("perf"):
        return False
    try:
        r = subprocess.run(["perf", "stat", "-a", "-x,", "-e", "syscalls:sys_enter_fdatasync", "--", "true"],
                           capture_output=True, text=True, timeout=20)
        return r.returncode == 0 and "sys_enter_fdatasync" in r.stderr and "not supported" not in r.stderr
    except (OSError, subprocess.TimeoutExpired):
        return False


class FsyncCounter:
    """System-wide fdatasync+fsync count while active (perf tracepoints)."""

    def __init__(self, enabled: bool):
        self.enabled, self.proc, self.out = enabled, None, None

    def __enter__(self):
        if self.enabled:
            self.out = tempfile.NamedTemporaryFile(prefix="perf-stat-", suffix=".csv", delete=False)
            self.proc = procguard.spawn(
                ["perf", "stat", "-a", "-x,", "-o", self.out.name,
                 "-e", "syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.3)  # let perf open its counters
        return self

    def stop(self) -> int | None:
        if not self.proc:
            return None
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(20)
        n = 0
        for line in Path(self.out.name).read_text().splitlines():
            parts = line.split(",")
            if len(parts) > 2 and "sys_enter_f" in line and parts[0].strip().isdigit():
                n += int(parts[0])
        os.unlink(self.out.name)
        self.proc = None
        return n

    def __exit__(self, *exc):
        if self.proc:
            self.stop()


def make_producer(bootstrap: str) -> Producer:
    return Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 1_048_576,
    })


def write_every_partition(bootstrap: str, topic: str, partitions: int):
    """One 1 KiB record to each partition, acks=all; returns when all are acknowledged."""
    p = make_producer(bootstrap)
    errors = []
    value = b"x" * RECORD_SIZE

    def cb(err, _msg):
        if err is not None:
            errors.append(err)
    for q in range(partitions):
        while True:
            try:
                p.produce(topic, value=value, partition=q, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(120)
    if left or errors:
        raise RuntimeError(f"write to every partition of {topic}: {left} undelivered, errors {errors[:3]}")


# --------------------------------------------------------------------------- footprint


def footprint(binary: Path, partitions: int, topics: int, keep: bool) -> dict:
    b = Tessera(binary)
    rows = []

    def snap(step: str, note: str = ""):
        time.sleep(0.5)  # let allocations from the last step settle
        rs = b.ranges()
        rows.append({
            "step": step, "topics": len({r["topic"] for r in rs}),
            "ranges_active": sum(r["active"] for r in rs), "ranges_total": len(rs),
            "segments": sum(r["segments"] for r in rs),
            "rss_kib": b.rss_kib(), "files": b.files(), "note": note,
        })
        r = rows[-1]
        log(f"    {step}: RSS {r['rss_kib'] / 1024:.1f} MiB, {r['files']} files, "
            f"{r['ranges_active']} active ranges, {r['segments']} segments")

    try:
        b.start()
        snap("empty broker")
        for t in range(1, topics + 1):
            name = f"fp-{t}"
            create_topic(b.bootstrap, name, partitions)
            snap(f"create topic {t} ({partitions:,} partitions)")
            write_every_partition(b.bootstrap, name, partitions)
            snap(f"write 1 record to each of its {partitions:,} partitions")
        for n in (2, 4):
            b.split_to("fp-1", n)
            snap(f"split topic 1 to {n} ranges")
        write_every_partition(b.bootstrap, "fp-1", partitions)
        snap(f"write 1 record to each of topic 1's {partitions:,} partitions again")
        topic_dir = next((b.data / "topics").glob("fp-1-*"))
        per_range = {}
        for r in b.ranges("fp-1"):
            d = topic_dir / str(r["id"])
            per_range[r["id"]] = {"lo": r["lo"], "hi": r["hi"], "active": r["active"],
                                  "segments": r["segments"],
                                  "files": sorted(p.name for p in d.iterdir()) if d.exists() else []}
        return {"rows": rows, "topic1_ranges": per_range, "data_dir": str(b.data) if keep else None}
    finally:
        b.stop(keep=keep)


def footprint_markdown(fp: dict, partitions: int) -> str:
    lines = [
        "| step | topics | active ranges (all) | segments | RSS MiB | Δ RSS MiB | files | Δ files |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    prev = None
    rows = fp["rows"]
    for r in rows:
        d_rss = "" if prev is None else f"{(r['rss_kib'] - prev['rss_kib']) / 1024:+.1f}"
        d_files = "" if prev is None else f"{r['files'] - prev['files']:+d}"
        lines.append(f"| {r['step']} | {r['topics']} | {r['ranges_active']} ({r['ranges_total']}) | "
                     f"{r['segments']} | {r['rss_kib'] / 1024:.1f} | {d_rss} | {r['files']} | {d_files} |")
        prev = r
    per_topic = []
    for t in range(1, 100):
        i = next((j for j, r in enumerate(rows) if r["step"].startswith(f"create topic {t} ")), None)
        if i is None or i == 0 or i + 1 >= len(rows):
            break
        before, after = rows[i - 1], rows[i + 1]
        per_topic.append(f"topic {t}: {(after['rss_kib'] - before['rss_kib']) / 1024:+.1f} MiB, "
                         f"{after['files'] - before['files']:+d} file(s)")
    if per_topic:
        lines += ["", f"Per {partitions:,}-partition topic (create + one record to every partition): "
                  + "; ".join(per_topic) + "."]
    lines += ["", "Topic 1's ranges after the splits (one directory per range; a sealed segment is "
              "`.log` + `.idx`, the active one `.log` only):", "",
              "| range | partitions | active | segments | files |", "|---:|---|---|---:|---|"]
    for rid, r in sorted(fp["topic1_ranges"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {rid} | [{r['lo']:,}, {r['hi']:,}) | {'yes' if r['active'] else 'no (parent)'} | "
                     f"{r['segments']} | {' '.join(r['files'])} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- throughput


def produce_run(b: Tessera, topic: str, n: int, partitions: int, pool: list[bytes], keys: list[bytes],
                max_s: float, fsync_perf: bool) -> dict:
    p = make_producer(b.bootstrap)
    p.list_topics(topic, timeout=30)  # metadata for 10,000 partitions before the clock starts
    delivered, errors = [0], [0]
    hit = bytearray(partitions)

    def cb(err, msg):
        if err is not None:
            errors[0] += 1
            return
        delivered[0] += 1
        hit[msg.partition()] = 1

    m0 = b.metrics()
    with FsyncCounter(fsync_perf) as fs:
        c0, k0, mc0 = client_cpu_seconds(), b.cpu_seconds(), machine_cpu()
        t0 = time.perf_counter()
        deadline = t0 + max_s
        i = 0
        nk = len(keys)
        while i < n and time.perf_counter() < deadline:
            try:
                p.produce(topic, key=keys[i % nk], value=pool[i % len(pool)], on_delivery=cb)
                i += 1
            except BufferError:
                p.poll(0.005)
                continue
            if i % 1000 == 0:
                p.poll(0)
        left = p.flush(max(5.0, deadline - time.perf_counter() + 30))
        elapsed = time.perf_counter() - t0
        c1, k1, mc1 = client_cpu_seconds(), b.cpu_seconds(), machine_cpu()
        fsyncs = fs.stop()
    m1 = b.metrics()
    total, idle, iowait = (mc1[j] - mc0[j] for j in range(3))
    ncpu = os.cpu_count() or 1
    busy_pct = 100 * ncpu * (total - idle - iowait) / total if total else float("nan")
    broker_pct = 100 * (k1 - k0) / elapsed
    client_pct = 100 * (c1 - c0) / elapsed
    reqs = m1.get('tessera_requests_total{api="Produce"}', 0) - m0.get('tessera_requests_total{api="Produce"}', 0)
    batches = m1.get("tessera_produced_batches_total", 0) - m0.get("tessera_produced_batches_total", 0)
    done = delivered[0]
    return {
        "records": done, "errors": errors[0], "undelivered": left, "seconds": elapsed,
        "rps": done / elapsed, "mbps": done * RECORD_SIZE / MB / elapsed, "complete": done == n,
        "partitions_hit": sum(hit),
        "broker_cpu_pct": broker_pct, "client_cpu_pct": client_pct,
        # percent of one core, like the two above; "other" = everything else on the machine
        "machine_busy_pct": busy_pct, "other_cpu_pct": max(0.0, busy_pct - broker_pct - client_pct),
        "iowait_pct": 100 * ncpu * iowait / total if total else float("nan"),
        "produce_requests_per_s": reqs / elapsed, "batches_per_request": batches / reqs if reqs else float("nan"),
        "records_per_request": done / reqs if reqs else float("nan"),
        "fsyncs_per_s": fsyncs / elapsed if fsyncs is not None else None,
        "records_per_fsync": done / fsyncs if fsyncs else None,
    }


def perf_report(data: Path, sort: str, *extra: str) -> list[tuple[str, float]]:
    rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", sort, *extra],
                         capture_output=True, text=True, timeout=300)
    rows = []
    for line in rep.stdout.splitlines():
        s = line.strip()
        if s and not s.startswith("#") and s.split()[0].endswith("%"):
            pct, rest = s.split(None, 1)
            rows.append((rest.strip(), float(pct.rstrip("%"))))
    return rows


def thread_group(comm: str) -> str:
    if comm.startswith("tokio-rt") or comm == "tessera":
        return "broker (tessera)"
    if comm.startswith("rdk:"):
        return f"client: librdkafka thread `{comm}`"
    if comm.startswith("python"):
        return "client: Python producing thread"
    if comm == "swapper":
        return "idle"
    if comm.startswith("perf"):
        return "perf itself"
    return "other processes"


def profile_run(b: Tessera, topic: str, n: int, partitions: int, pool, keys, max_s: float):
    """perf record (whole machine, cpu-clock) during one produce run."""
    data = Path(tempfile.mkdtemp(prefix="perf-ranges-")) / "perf.data"
    rec = procguard.spawn(["perf", "record", "-a", "-e", "cpu-clock", "-F", "499", "-o", str(data)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        run = produce_run(b, topic, n, partitions, pool, keys, max_s, False)
    finally:
        rec.send_signal(signal.SIGINT)
        rec.wait(60)
    out = {"run": run, "by_thread": {}, "broker_top": [], "client_top": []}
    try:
        ncpu = os.cpu_count() or 1
        for comm, pct in perf_report(data, "comm"):
            g = thread_group(comm)
            # share of all samples -> % of one core
            out["by_thread"][g] = out["by_thread"].get(g, 0.0) + pct * ncpu
        rel = ("--percentage", "relative", "--percent-limit", "2")
        out["broker_top"] = perf_report(data, "dso,sym", "--comms", "tokio-rt-worker,tessera", *rel)
        comms = ",".join(sorted({c for c, _ in perf_report(data, "comm") if c.startswith("rdk:")
                                 or c.startswith("python")})) or "python"
        out["client_top"] = perf_report(data, "dso,sym", "--comms", comms, *rel)
    except (OSError, subprocess.TimeoutExpired) as e:
        out["error"] = str(e)
    shutil.rmtree(data.parent, ignore_errors=True)
    return out


def throughput(binary: Path, partitions: int, n: int, repeat: int, counts: list[int], max_s: float,
               fsync_perf: bool, profile: bool) -> dict:
    b = Tessera(binary)
    rnd = random.Random(7)
    pool = [rnd.randbytes(RECORD_SIZE) for _ in range(256)]
    # as many distinct keys as records (at least 2^18): 200k random keys miss none of 10,000
    # partitions (expected misses: 10,000 x e^-20)
    keys = [rnd.randbytes(16) for _ in range(max(n, 1 << 18))]
    topic = "tput"
    results = {}
    try:
        b.start()
        create_topic(b.bootstrap, topic, partitions)
        log("    warm-up run (not counted)")
        produce_run(b, topic, min(n, 50_000), partitions, pool, keys, max_s, False)
        for count in counts:
            b.split_to(topic, count)
            active = b.active_ranges(topic)
            log(f"    {len(active)} range(s): " + ", ".join(f"#{r['id']} [{r['lo']},{r['hi']})" for r in active))
            runs = []
            for rep in range(repeat):
                r = produce_run(b, topic, n, partitions, pool, keys, max_s, fsync_perf)
                log(f"      run {rep + 1}: {r['rps']:,.0f} rec/s, broker {r['broker_cpu_pct']:.0f}% "
                    f"client {r['client_cpu_pct']:.0f}% other {r['other_cpu_pct']:.0f}% "
                    f"iowait {r['iowait_pct']:.0f}% fsync/s {r['fsyncs_per_s'] or 0:.0f}")
                runs.append(r)
            med = {k: (statistics.median([x[k] for x in runs]) if isinstance(v, (int, float))
                       and not isinstance(v, bool) and all(x[k] is not None for x in runs) else v)
                   for k, v in runs[0].items()}
            med["complete"] = all(x["complete"] for x in runs)
            results[count] = {"median": med, "runs": runs, "ranges": len(active)}
        prof = None
        if profile:
            log(f"    profile run at {counts[-1]} ranges (perf record -a, not counted)")
            prof = profile_run(b, topic, n, partitions, pool, keys, max_s)
        return {"by_ranges": results, "profile": prof}
    finally:
        b.stop()


def fmt(x, spec=",.0f"):
    return "n/a" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def throughput_markdown(tp: dict, n: int, partitions: int, repeat: int) -> str:
    res = tp["by_ranges"]
    base = res[min(res)]["median"]["rps"]
    lines = [
        "| ranges | records/s | MB/s | vs 1 range | partitions hit | note |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for count, r in res.items():
        m = r["median"]
        note = "" if m["complete"] else f"incomplete: {m['records']:,} delivered, {m['errors']} errors"
        lines.append(f"| {r['ranges']} | {fmt(m['rps'])} | {fmt(m['mbps'], '.1f')} | {m['rps'] / base:.2f}x | "
                     f"{fmt(m['partitions_hit'])} | {note} |")
    lines += ["", "Where the time goes (medians of the same runs; CPU in % of one core, the machine has "
              f"{os.cpu_count()}):", "",
              "| ranges | broker CPU % | client CPU % | other processes CPU % | machine idle % | iowait % | "
              "produce requests/s | partitions per request | records per request | fdatasync/s | "
              "records per fdatasync |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ncpu = os.cpu_count() or 1
    for count, r in res.items():
        m = r["median"]
        idle = 100 * ncpu - m["machine_busy_pct"] - m["iowait_pct"]
        lines.append(f"| {r['ranges']} | {fmt(m['broker_cpu_pct'])} | {fmt(m['client_cpu_pct'])} | "
                     f"{fmt(m['other_cpu_pct'])} | {fmt(idle)} | {fmt(m['iowait_pct'])} | "
                     f"{fmt(m['produce_requests_per_s'])} | {fmt(m['batches_per_request'], '.2f')} | "
                     f"{fmt(m['records_per_request'], '.1f')} | "
                     f"{fmt(m['fsyncs_per_s'])} | {fmt(m['records_per_fsync'])} |")
    prof = tp.get("profile")
    if prof and prof.get("by_thread"):
        pr = prof["run"]
        lines += ["", f"perf profile of the whole machine (`perf record -a -e cpu-clock`) during one more "
                  f"{max(res)}-range run ({fmt(pr['rps'])} rec/s), CPU by thread group in % of one core:", "",
                  "| threads | CPU % of one core |", "|---|---:|"]
        for g, pct in sorted(prof["by_thread"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {g} | {pct:.0f} |")
        for title, key in (("Client's hottest symbols (% of client samples)", "client_top"),
                           ("Broker's hottest symbols (% of broker samples)", "broker_top")):
            if prof.get(key):
                lines += ["", title + ":", "", "| object | symbol | % |", "|---|---|---:|"]
                for sym, pct in prof[key][:8]:
                    dso, _, name = sym.partition(" ")
                    name = name.strip().split("] ", 1)[-1].strip()[:80]
                    lines.append(f"| {dso} | `{name}` | {pct:.1f} |")
    return "\n".join(lines)


def bottleneck(tp: dict) -> str:
    """A rule-of-thumb reading of the observations (the docs carry the considered sentence)."""
    res = tp["by_ranges"]
    ncpu = os.cpu_count() or 1
    worst = res[max(res)]["median"]
    first = res[min(res)]["median"]
    gain = worst["rps"] / first["rps"]
    busy = worst["machine_busy_pct"]
    parts = [f"{max(res)} ranges give {gain:.2f}x the 1-range rate."]
    client, broker, other = worst["client_cpu_pct"], worst["broker_cpu_pct"], worst["other_cpu_pct"]
    if client >= 75 and client >= 2 * broker:
        parts.append(f"The client is the limit: it uses {client:.0f}% of a core against the broker's "
                     f"{broker:.0f}%, {worst['batches_per_request']:.2f} partitions and "
                     f"{worst['records_per_request']:.1f} records per produce request.")
    elif broker >= 75:
        parts.append(f"The broker is the limit: {broker:.0f}% of a core (client {client:.0f}%).")
    elif busy >= 85 * ncpu:
        parts.append(f"The machine is CPU-saturated ({busy:.0f}% of {100 * ncpu}%: broker {broker:.0f}%, "
                     f"client {client:.0f}%).")
    else:
        parts.append(f"CPU is not saturated ({busy:.0f}% busy, iowait {worst['iowait_pct']:.0f}%): "
                     "waiting (fdatasync, request round trips) limits the rate.")
    if other >= 20:
        parts.append(f"Other processes took {other:.0f}% of a core during the runs: the figures are low.")
    return " ".join(parts)


def main():
    procguard.install_sigterm_handler()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--topics", type=int, default=3, help="topics created in the footprint phase")
    ap.add_argument("--records", type=int, default=200_000, help="records per throughput run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per range count; tables show medians")
    ap.add_argument("--ranges", default="1,2,4", help="range counts for the throughput phase")
    ap.add_argument("--max-seconds", type=float, default=60, help="time cap per produce run")
    ap.add_argument("--skip-footprint", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--no-perf", action="store_true", help="no perf stat / perf record even if available")
    ap.add_argument("--keep-data", action="store_true", help="keep the footprint phase's data dir")
    ap.add_argument("--tessera-bin", default=os.environ.get("TESSERA_BIN", str(REPO / "target/release/tessera")))
    ap.add_argument("--json", help="also write raw results here")
    args = ap.parse_args()

    binary = Path(args.tessera_bin)
    if not binary.exists():
        sys.exit(f"tessera binary not found: {binary} (cargo build --release -p tessera-gateway)")
    use_perf = not args.no_perf and perf_usable()
    if not use_perf:
        log("perf not usable (or --no-perf): no fdatasync counts, no profile")
    counts = [int(x) for x in args.ranges.split(",")]
    started = time.monotonic()
    out = {"date": datetime.date.today().isoformat(), "partitions": args.partitions, "records": args.records,
           "repeat": args.repeat, "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()}
    md = [f"## Ranges ({datetime.date.today().isoformat()}, {os.cpu_count()} cores, "
          f"load average before the run {os.getloadavg()[0]:.2f})", ""]
    if not args.skip_footprint:
        log(f"... footprint: {args.topics} topics x {args.partitions:,} partitions")
        out["footprint"] = footprint(binary, args.partitions, args.topics, args.keep_data)
        md += [f"### Footprint: {args.topics} topics of {args.partitions:,} partitions on a fresh broker", "",
               footprint_markdown(out["footprint"], args.partitions), ""]
    if not args.skip_throughput:
        log(f"... throughput: {args.records:,} x 1 KiB to a {args.partitions:,}-partition topic at "
            f"{counts} ranges, median of {args.repeat}")
        out["throughput"] = throughput(binary, args.partitions, args.records, args.repeat, counts,
                                       args.max_seconds, use_perf, use_perf)
        md += [f"### Produce, {args.records:,} x 1 KiB records, random keys over {args.partitions:,} "
               f"partitions, acks=all, linger.ms=5, confluent-kafka, one client process, "
               f"median of {args.repeat} runs", "",
               throughput_markdown(out["throughput"], args.records, args.partitions, args.repeat), "",
               "Rule-of-thumb reading: " + bottleneck(out["throughput"])]
    out["seconds"] = time.monotonic() - started
    md += ["", f"(benchmark wall time {out['seconds']:.0f} s)"]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
