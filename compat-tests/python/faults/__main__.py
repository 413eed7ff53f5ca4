"""``python -m faults``: the fault harness (see scripts/faults.sh and
docs/RELIABILITY.md). Runs from compat-tests/python as root."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import KafkaException

from . import checker, nemesis, netns, selftest, workload

REPO = Path(__file__).resolve().parents[3]


def parse(argv):
    ap = argparse.ArgumentParser(prog="faults.sh", description=__doc__)
    ap.add_argument("--minutes", type=float, default=3.0, help="minutes of faults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    ap.add_argument("--nemeses", default=",".join(nemesis.KINDS),
                    help=f"comma-separated subset of {','.join(nemesis.KINDS)}")
    ap.add_argument("--partitions", type=int, default=6, help="partitions of each topic")
    ap.add_argument("--rate", type=float, default=150.0, help="records/s per queue producer")
    ap.add_argument("--value-bytes", type=int, default=700)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy node logs and the history here (always on anomalies)")
    ap.add_argument("--override", "-o", action="append", default=[],
                    help="key=value for every node (e.g. a deliberately broken config)")
    ap.add_argument("--lying-fsync", action="store_true",
                    help="a deliberately broken broker: fsync of range data returns success "
                         "without syncing (with crash or crash-all, the checker must fail)")
    ap.add_argument("--self-test", action="store_true",
                    help="run the checker on synthetic histories and exit")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack
    if args.self_test:
        return 0 if selftest.run() else 1
    kinds = [k for k in args.nemeses.split(",") if k]
    unknown = set(kinds) - set(nemesis.KINDS)
    if unknown:
        print(f"unknown nemeses: {sorted(unknown)}", file=sys.stderr)
        return 2
    binary = Path(os.environ.get("TESSERA_BIN", REPO / "target" / "release" / "tessera"))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tessera-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    overrides = dict(o.split("=", 1) for o in args.override)
    print(f"faults: seed {args.seed}, {args.nodes} nodes, {args.minutes} min of {kinds}, "
          f"work dir {workdir}", flush=True)

    netns.setup(args.nodes)
    netns.enter_client_ns()
    from .cluster import Cluster  # after setns: nothing of it binds before

    logger = workload.client_logger(workdir / "clients.log")
    cluster = Cluster(workdir, binary, args.nodes, overrides)
    history = workload.History()
    stop_producers, stop_consumers = threading.Event(), threading.Event()
    workers: list[workload.Worker] = []
    report = None
    if args.lying_fsync:
        for n in cluster.nodes.values():
            n.lie_trigger.touch()
    try:
        cluster.start_all()
        create_topics(cluster, args.partitions, logger)
        boot = cluster.bootstrap
        common = dict(history=history, logger=logger)
        for i in range(2):
            workers.append(workload.QueueProducer(
                f"queue-producer-{i}", boot, stop=stop_producers, producer=i,
                partitions=args.partitions, rate=args.rate, value_bytes=args.value_bytes,
                **common))
        for i in range(2):
            workers.append(workload.GroupConsumer(
                f"queue-consumer-{i}", boot, stop=stop_consumers, consumer=f"q{i}",
                group=workload.QUEUE_GROUP, topic=workload.QUEUE, committed=False, **common))
        for i in range(2):
            workers.append(workload.TxnProducer(
                f"txn-producer-{i}", boot, stop=stop_producers, producer=i,
                partitions=args.partitions, seed=args.seed, pace=0.05, **common))
        workers.append(workload.GroupConsumer(
            "txn-consumer-0", boot, stop=stop_consumers, consumer="r0",
            group=workload.TXN_GROUP, topic=workload.TXN, committed=True, **common))
        for w in workers:
            w.start()
        time.sleep(5)  # traffic flows before the first fault

        nem = nemesis.Nemesis(cluster, history, logger, args.seed)
        steps = nemesis.schedule(args.seed, kinds, 100000)
        deadline = time.monotonic() + args.minutes * 60
        started = time.monotonic()
        for step in steps:
            if time.monotonic() + step.gap >= deadline:
                break
            time.sleep(step.gap)
            event = nem.run(step)
            if event is not None:
                history.add("faults", event)
                role = f" ({step.role})" if "role" in event else ""
                length = f" for {step.duration:.1f}s" if step.duration else ""
                print(f"  {event['t']:8.1f}s {event['kind']:<11} {event.get('target', '')}"
                      f"{role}{length}", flush=True)
        minutes = (time.monotonic() - started) / 60

        print("faults: healing (network, paused nodes, triggers, restarts)", flush=True)
        heal(cluster)
        time.sleep(15)  # traffic after the heal: the cluster must serve again
        stop_producers.set()
        for w in workers:
            if isinstance(w, (workload.QueueProducer, workload.TxnProducer)):
                w.join(240)
        # Consumers drain what was produced, then stop.
        drain(history, timeout=120)
        stop_consumers.set()
        for w in workers:
            w.join(60)
        print("faults: reading everything back", flush=True)
        heal(cluster)
        try:
            history.final = final_read(cluster, args.partitions, logger)
        finally:
            history.save(workdir / "history.json")
            save_images(cluster, workdir)
        for w in workers:
            if w.error is not None:
                print(f"worker {w.name} died: {w.error!r}")
                history.add("workers", {"worker": w.name, "what": "died", "error": repr(w.error)})
        dead = [w.name for w in workers if w.is_alive()]
        for name in dead:
            history.add("workers", {"worker": name, "what": "stuck"})
        history.save(workdir / "history.json")
        report = checker.check(history.as_dict())
        print(checker.render(report, minutes))
        unacked = {w.name: w.unacked for w in workers
                   if isinstance(w, workload.QueueProducer) and w.unacked}
        if unacked:
            print(f"records neither acknowledged nor failed at the end: {unacked}")
        if dead:
            print(f"workers still running (stuck): {dead}; their stacks:", flush=True)
            faulthandler.dump_traceback(all_threads=True)
        (workdir / "report.txt").write_text(checker.render(report, minutes) + "\n")
        (workdir / "faults.json").write_text(json.dumps(history.faults, indent=1))
        return 0 if report.ok and not dead else 1
    finally:
        stop_producers.set()
        stop_consumers.set()
        keep = args.keep
        if keep is None and (report is None or not report.ok):
            keep = Path(f"{workdir}-kept")
        if keep is not None:
            cluster.copy_logs(keep)
            for f in ("history.json", "report.txt", "faults.json", "clients.log",
                      *(p.name for p in workdir.glob("image-node-*.json"))):
                if (workdir / f).exists():
                    shutil.copy(workdir / f, keep / f)
            print(f"faults: logs kept under {keep}")
        cluster.stop_all()
        netns.cleanup()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def create_topics(cluster, partitions: int, logger) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": cluster.bootstrap, "logger": logger})
    config = {"segment.bytes": str(1 << 20), "min.insync.replicas": "2"}
    topics = [NewTopic(t, partitions, 3, config=config) for t in (workload.QUEUE, workload.TXN)]
    for t, f in a.create_topics(topics, request_timeout=60).items():
        f.result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = a.list_topics(timeout=10)
        if all(t in md.topics and len(md.topics[t].partitions) == partitions and
               all(p.leader > 0 for p in md.topics[t].partitions.values())
               for t in (workload.QUEUE, workload.TXN)):
            return
        time.sleep(0.5)
    raise RuntimeError("topics not ready")


def heal(cluster) -> None:
    netns.heal_all(max(cluster.nodes))
    for n in cluster.nodes.values():
        n.clear_triggers()
        if n.paused:
            n.resume()
        if not n.running():
            n.start()
    for n in cluster.nodes.values():
        if not n.wait_ready(120):
            print(f"faults: node {n.id} not ready after the heal")


def drain(history, timeout: float) -> None:
    """Wait until the consumers polled nothing new for 15 s."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = len(history.polls)
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 15:
            return
        time.sleep(1)


def final_read(cluster, partitions: int, logger) -> dict:
    boot = cluster.bootstrap
    unavailable: list = []
    return {
        "uncommitted": {t: workload.read_back(boot, t, partitions, False, logger, unavailable)
                        for t in (workload.QUEUE, workload.TXN)},
        "committed": {t: workload.read_back(boot, t, partitions, True, logger, unavailable)
                      for t in (workload.QUEUE, workload.TXN)},
        "unavailable": unavailable,
        "group_offsets": {
            group: {topic: committed_or_unavailable(boot, group, topic, partitions, logger,
                                                    unavailable)}
            for group, topic in ((workload.QUEUE_GROUP, workload.QUEUE),
                                 (workload.TXN_GROUP, workload.TXN))
        },
    }


def save_images(cluster, workdir: Path) -> None:
    """Each live node's view of the ranges and segments (with the sealed
    spans reads look up) after the final read, kept with the logs: what a
    stuck read or an unreadable history is checked against."""
    import urllib.request
    for n in cluster.live():
        view = {}
        for what in ("ranges", "segments"):
            try:
                with urllib.request.urlopen(n.admin_url(f"/{what}"), timeout=30) as r:
                    view[what] = json.loads(r.read())
            except OSError as e:
                view[what] = f"unavailable: {e}"
        (workdir / f"image-node-{n.id}.json").write_text(json.dumps(view))


def committed_or_unavailable(boot, group, topic, partitions, logger, unavailable) -> dict:
    """The group's committed offsets; a coordinator still not reachable a
    minute after healing is an `unavailable` anomaly (the rest is still
    checked), not a crash of the harness."""
    try:
        return workload.group_offsets(boot, group, topic, partitions, logger)
    except KafkaException as e:
        logger.error("final read: committed offsets of %s: %s", group, e)
        unavailable.append({"group": group, "topic": topic, "error": str(e)})
        return {}


if __name__ == "__main__":
    sys.exit(main())
