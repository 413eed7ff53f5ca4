"""Nemeses of the fault harness, mixed at random from a seed, one at a time
with a quiet gap (2-8 s) between them.

* kill       kill -9 of a node, restarted 0-10 s later
* crash      kill -9, then the node's unsynced writes are lost (lazyfs.py),
             restarted 0-10 s later
* crash-all  a power loss of the whole cluster: every node at once, as crash
* pause      SIGSTOP for 1-40 s, then SIGCONT (a zombie primary or controller)
* partition  for 5-30 s: one node isolated, a majority/minority split, or a
             bridge (two halves that only one node connects)
* fsync-fail fsync/fdatasync of range data fail with EIO on one node for 2-10 s
             (Kafka: the log dir goes offline); the node is then restarted
* fsync-hang fsync/fdatasync of range data hang on one node for 2-20 s
* join       a new broker-only node starts (at most 2 beyond the cluster)
* leave      a joined broker-only node is killed and unregistered
             (UnregisterBroker, as `kafka-cluster.sh unregister`)
* split      an active range with more than one partition is split
* merge      two adjacent active ranges of a topic are merged

The target of kill, crash, pause and the fsync faults is, drawn from the
seed, the primary of a busy range (the leader of a queue partition in
Metadata), the controller leader (DescribeCluster) or any node. The
sequence of kinds, durations and target roles is a function of the seed
alone (``schedule``); which node holds a role is the cluster's state.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from helpers import uvarint

from . import netns

KINDS = ("kill", "crash", "crash-all", "pause", "partition", "fsync-fail", "fsync-hang",
         "join", "leave", "split", "merge")
ROLES = ("primary", "controller", "any")
MAX_JOINED = 2


@dataclass
class Step:
    kind: str
    gap: float  # quiet seconds before it
    duration: float
    role: str  # primary | controller | any
    shape: str  # partition: isolate | majority | bridge
    pick: float  # in [0, 1): which of the candidates


def schedule(seed: int, kinds: list[str], count: int) -> list[Step]:
    """The first `count` steps of the seed's schedule (pure)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        kind = rng.choice(kinds)
        duration = {"pause": rng.uniform(1, 40), "partition": rng.uniform(5, 30),
                    "fsync-fail": rng.uniform(2, 10), "fsync-hang": rng.uniform(2, 20),
                    "kill": rng.uniform(0, 10), "crash": rng.uniform(0, 10),
                    "crash-all": rng.uniform(0, 5)}.get(kind, 0.0)
        out.append(Step(kind=kind, gap=rng.uniform(2, 8), duration=round(duration, 2),
                        role=rng.choice(ROLES), shape=rng.choice(("isolate", "majority", "bridge")),
                        pick=rng.random()))
    return out


def partition_links(nodes: list[int], shape: str, pick: float) -> tuple[list[tuple[int, int]], str]:
    """The node pairs to cut for a partition shape (pure)."""
    order = sorted(nodes)
    k = int(pick * len(order))
    rot = order[k:] + order[:k]
    if shape == "isolate" or len(order) < 3:
        a = rot[0]
        return [(a, b) for b in order if b != a], f"isolate {a}"
    if shape == "majority":
        minority = rot[: (len(order) - 1) // 2]
        majority = [n for n in order if n not in minority]
        return ([(a, b) for a in minority for b in majority],
                f"minority {minority} | majority {majority}")
    bridge = rot[0]
    rest = rot[1:]
    left, right = rest[: len(rest) // 2], rest[len(rest) // 2:]
    return ([(a, b) for a in left for b in right],
            f"bridge {bridge} between {left} and {right}")


# ---- UnregisterBroker (no Python client has it): a raw v0 request ---------

def unregister_broker(bootstrap: str, broker_id: int) -> int:
    """UnregisterBroker v0 (flexible: request header v2); the error code."""
    host, port = bootstrap.rsplit(":", 1)
    body = struct.pack(">i", broker_id) + uvarint(0)
    msg = struct.pack(">hhih", 64, 0, 7, 1) + b"f" + uvarint(0) + body
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(struct.pack(">i", len(msg)) + msg)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("connection closed")
            buf += chunk
    # correlation id, header tagged fields (one 0 byte), throttle, error code
    return struct.unpack(">h", buf[4 + 4 + 1 + 4: 4 + 4 + 1 + 4 + 2])[0]


class Nemesis:
    def __init__(self, cluster, history, logger, rng_seed: int):
        self.cluster, self.history, self.logger = cluster, history, logger
        self.original = set(cluster.nodes)
        self.rng = random.Random(rng_seed ^ 0x5EED)

    # ---- where things are ------------------------------------------------
    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": ",".join(n.bootstrap for n in self.cluster.live())
                            or self.cluster.bootstrap, "logger": self.logger})

    def primary(self) -> int | None:
        try:
            md = self.admin().list_topics("queue", timeout=10)
            leaders = sorted({p.leader for p in md.topics["queue"].partitions.values()
                              if p.leader > 0})
            return self.rng.choice(leaders) if leaders else None
        except Exception:  # noqa: BLE001 - no target then
            return None

    def controller(self) -> int | None:
        """The metadata quorum's leader as a voter sees it (a broker that
        does not know the leader names itself in DescribeCluster)."""
        voters = [n for n in self.cluster.live() if n.voter]
        if not voters:
            return None
        try:
            a = AdminClient({"bootstrap.servers": ",".join(n.bootstrap for n in voters),
                             "logger": self.logger})
            leader = a.describe_cluster(request_timeout=10).result(15).controller.id
        except Exception:  # noqa: BLE001
            return None
        return leader if leader in {n.id for n in voters} else None

    def target(self, step: Step) -> int:
        ids = sorted(n.id for n in self.cluster.live())
        role_id = self.primary() if step.role == "primary" else \
            self.controller() if step.role == "controller" else None
        if role_id in ids:
            return role_id
        return ids[int(step.pick * len(ids))]

    def ranges(self) -> list[dict]:
        for n in self.cluster.live():
            try:
                with urllib.request.urlopen(n.admin_url("/ranges"), timeout=10) as r:
                    return json.loads(r.read())
            except OSError:
                continue
        return []

    def post(self, path: str, to: int | None = None) -> str:
        """POSTs to the admin port of node `to` (a range's primary, which
        alone splits or merges it) if live, else of the first live node."""
        live = sorted(self.cluster.live(), key=lambda n: n.id != to)
        for n in live:
            req = urllib.request.Request(n.admin_url(path), method="POST", data=b"")
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.read().decode()
            except urllib.error.HTTPError as e:
                return f"{e.code} {e.read().decode()}"
            except OSError:
                continue
        return "no node answered"

    # ---- one step --------------------------------------------------------
    def run(self, step: Step) -> dict | None:
        """Inject one fault and heal it; the fault event (None when the step
        had nothing to act on, e.g. a merge with no adjacent ranges)."""
        t = self.history.now()
        kind = step.kind
        event = {"kind": kind, "t": t, "duration": step.duration}
        c = self.cluster
        if kind in ("kill", "crash", "pause", "fsync-fail", "fsync-hang"):
            node = c.nodes[self.target(step)]
            event.update(target=node.id, role=step.role)
            self.mark(f"{kind} node {node.id} ({step.role}) for {step.duration}s")
            event["t"] = self.history.now()  # the injection, after the lookups
            if kind in ("kill", "crash"):
                node.kill()
                if kind == "crash":
                    plan = node.lose_unsynced()
                    event["lost_bytes"] = plan.bytes_dropped
                    event["lost_names"] = len(plan.names)
                    event["cut_files"] = len(plan.truncate)
                time.sleep(step.duration)
                node.start()
                event["ready"] = node.wait_ready(120)
            elif kind == "pause":
                node.pause()
                time.sleep(step.duration)
                node.resume()
            elif kind == "fsync-fail":
                node.fail_trigger.touch()
                time.sleep(step.duration)
                node.fail_trigger.unlink(missing_ok=True)
                node.kill()
                node.start()
                event["ready"] = node.wait_ready(120)
            else:
                node.hang_trigger.touch()
                time.sleep(step.duration)
                node.hang_trigger.unlink(missing_ok=True)
        elif kind == "crash-all":
            self.mark(f"crash-all for {step.duration}s")
            event["t"] = self.history.now()
            nodes = [n for n in c.nodes.values() if n.running()]
            for node in nodes:
                node.kill()
            event["target"] = "all"
            event["lost_bytes"] = sum(node.lose_unsynced().bytes_dropped for node in nodes)
            time.sleep(step.duration)
            for node in nodes:
                node.start()
            event["ready"] = all([node.wait_ready(120) for node in nodes])
        elif kind == "partition":
            ids = sorted(n.id for n in c.nodes.values() if n.running())
            links, what = partition_links(ids, step.shape, step.pick)
            event["target"] = what
            self.mark(f"partition {what} for {step.duration}s")
            event["t"] = self.history.now()
            netns.apply_partition(links)
            time.sleep(step.duration)
            netns.heal_all(max(c.nodes))
        elif kind == "join":
            joined = [i for i in c.nodes if i not in self.original]
            if len(joined) >= MAX_JOINED:
                return None
            next_id = max([*c.nodes, *(r.id for r in c.retired)]) + 1
            if next_id >= 100:  # 10.77.0.100 is the clients'
                return None
            node = c.add_node(next_id)
            event["target"] = node.id
            self.mark(f"join node {node.id}")
            node.start()
            event["ready"] = node.wait_ready(120)
        elif kind == "leave":
            joined = [i for i in c.nodes if i not in self.original and c.nodes[i].running()]
            if not joined:
                return None
            node = c.nodes[joined[int(step.pick * len(joined))]]
            event["target"] = node.id
            self.mark(f"leave node {node.id} (kill -9, UnregisterBroker once fenced)")
            node.kill()
            # Kafka's operator unregisters a broker that is gone: wait out the
            # session (broker.session.timeout.ms) so it is fenced first.
            time.sleep(float(c.overrides["broker.session.timeout.ms"]) / 1000 + 2)
            live = [n for n in c.live()]
            code = None
            for n in live:
                try:
                    code = unregister_broker(n.bootstrap, node.id)
                    break
                except OSError:
                    continue
            event["error_code"] = code
            c.retired.append(c.nodes.pop(node.id))
        elif kind == "split":
            cands = sorted((r for r in self.ranges() if r["active"] and r["hi"] - r["lo"] > 1),
                           key=lambda r: r["id"])
            if not cands:
                return None
            r = cands[int(step.pick * len(cands))]
            event["target"] = f"range {r['id']} ({r['topic']} [{r['lo']},{r['hi']}))"
            self.mark(f"split {event['target']}")
            event["answer"] = self.post(f"/ranges/split?range={r['id']}", to=r.get("primary"))
        elif kind == "merge":
            active = sorted((r for r in self.ranges() if r["active"]),
                            key=lambda r: (r["topic"], r["lo"]))
            # Adjacent ranges with the same primary: a merge of ranges led
            # by different brokers is refused (moving one first is the
            # scale-out issue's).
            pairs = [(a, b) for a, b in zip(active, active[1:])
                     if a["topic"] == b["topic"] and a["hi"] == b["lo"]
                     and a.get("primary") is not None and a.get("primary") == b.get("primary")]
            if not pairs:
                return None
            a, b = pairs[int(step.pick * len(pairs))]
            event["target"] = f"ranges {a['id']}+{b['id']} ({a['topic']})"
            self.mark(f"merge {event['target']}")
            event["answer"] = self.post(f"/ranges/merge?left={a['id']}&right={b['id']}",
                                        to=a["primary"])
        event["end"] = self.history.now()
        return event

    def mark(self, text: str) -> None:
        self.logger.warning("nemesis: %s", text)
        for n in self.cluster.nodes.values():
            n.log_mark(text)
