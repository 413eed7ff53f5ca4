"""The fault harness's checker: a pure function of the history (what the
clients saw during the run) and of the final read-back (every partition
read from the start after healing, read_uncommitted and read_committed).

Anomalies (each with its first examples):

* ``lost``            an acknowledged record (queue, or of a committed
                      transaction) is not in the final read
* ``duplicate``       a value is stored at more than one offset
* ``wrong-offset``    an acknowledged value is stored at another offset than
                      its acknowledgement said
* ``aborted-read``    a read_committed read (a poll, or the final read)
                      returned a record of an aborted transaction
* ``txn-missing``     a committed transaction's record is missing from the
                      final read_committed read
* ``offset-backwards`` a group's committed offset went backwards (successive
                      successful commits, and the final committed offset
                      against the last successful commit)
* ``poll-skip``       within one consumer assignment session, two successive
                      polls of a partition jump over a record the final
                      read holds
* ``poll-back``       ... or go back (or repeat an offset)
* ``read-then-gone``  a poll returned a record the final read does not hold
                      at that offset (a read of a record later gone or moved)
* ``unconsumed``      an acknowledged queue record below its group's final
                      committed offset that no consumer of the group polled
* ``unavailable``     after healing, a partition's end offset cannot be had
                      (a liveness failure: the read-back is incomplete)
* ``client-fatal``    a client could not go on: an idempotent producer got a
                      fatal error (e.g. librdkafka's "sequence
                      desynchronization" after OUT_OF_ORDER_SEQUENCE_NUMBER:
                      the broker's producer state disagrees with what it
                      acknowledged), or a worker died or was stuck at the end

Outcome-unknown sends (an error, a timeout) are not anomalies when
missing, only when stored twice or moved.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

EXAMPLES = 5
KINDS = ("lost", "duplicate", "wrong-offset", "aborted-read", "txn-missing",
         "offset-backwards", "poll-skip", "poll-back", "read-then-gone", "unconsumed", "unavailable",
         "client-fatal")


@dataclass
class Report:
    anomalies: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pauses: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    acked: int = 0
    txns: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    read_back: int = 0

    def add(self, kind: str, example) -> None:
        self.counts[kind] += 1
        if len(self.anomalies[kind]) < EXAMPLES:
            self.anomalies[kind].append(example)

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def _index(final: dict) -> tuple[dict, dict]:
    """(topic, p) -> {offset: value}, and value -> [(topic, p, offset)]."""
    at, where = {}, defaultdict(list)
    for topic, parts in final.items():
        for p, records in parts.items():
            m = {}
            for o, v in records:
                m[o] = v
                where[v].append((topic, int(p), o))
            at[(topic, int(p))] = m
    return at, where


def normalize(history: dict) -> dict:
    """Partition keys back to ints (JSON made them strings)."""
    final = history.setdefault("final", {})
    for key in ("uncommitted", "committed"):
        final[key] = {t: {int(p): [tuple(r) for r in recs] for p, recs in parts.items()}
                      for t, parts in final.get(key, {}).items()}
    final["group_offsets"] = {g: {t: {int(p): o for p, o in parts.items()}
                                  for t, parts in topics.items()}
                              for g, topics in final.get("group_offsets", {}).items()}
    return history


def check(history: dict) -> Report:
    """`history`: {"acks": [...], "txns": [...], "polls": [...], "commits": [...],
    "faults": [...], "final": {"uncommitted": {topic: {p: [[o, v]...]}},
    "committed": {...}, "group_offsets": {group: {topic: {p: o}}}}}.
    Each ack {"t", "topic", "p", "o", "v", "txn": id|None}; each txn {"id",
    "status": committed|aborted|unknown, "values": [v...]}; each poll
    {"consumer", "session", "group", "topic", "p", "o", "v", "committed": bool};
    each commit {"t", "group", "topic", "p", "o"}; each fault {"kind", "t"}."""
    r = Report()
    final = normalize(history)["final"]
    un_at, un_where = _index(final.get("uncommitted", {}))
    co_at, co_where = _index(final.get("committed", {}))
    r.read_back = sum(len(m) for m in un_at.values())
    txn_status = {t["id"]: t["status"] for t in history.get("txns", [])}
    for t in history.get("txns", []):
        r.txns[t["status"]] += 1

    for u in final.get("unavailable", []):
        r.add("unavailable", u)
    for w in history.get("workers", []):
        r.add("client-fatal", w)

    # Stored twice.
    for v, places in un_where.items():
        if len(places) > 1:
            r.add("duplicate", {"value": v, "at": sorted(places)})

    # Every acknowledgement against the final read.
    for a in history.get("acks", []):
        status = txn_status.get(a["txn"]) if a.get("txn") is not None else None
        if status in ("aborted", "unknown"):
            continue
        r.acked += 1
        places = un_where.get(a["v"], [])
        key = (a["topic"], a["p"], a["o"])
        if not places:
            r.add("lost", {"topic": a["topic"], "p": a["p"], "o": a["o"], "value": a["v"]})
        elif a["o"] is not None and key not in places:
            # (librdkafka acknowledges a record without an offset when a
            # later batch's success proves an earlier one whose answer was
            # lost: only that it is stored, once, is checked then.)
            r.add("wrong-offset", {"value": a["v"], "acked": key, "stored": sorted(places)})

    # Transactions against read_committed.
    for t in history.get("txns", []):
        for v in t["values"]:
            if t["status"] == "aborted" and v in co_where:
                r.add("aborted-read", {"txn": t["id"], "value": v, "at": co_where[v], "by": "final"})
            if t["status"] == "committed" and v not in co_where:
                r.add("txn-missing", {"txn": t["id"], "value": v,
                                      "uncommitted_at": un_where.get(v, [])})

    # Polls: sessions, and against the final read.
    sessions = defaultdict(list)
    for pl in history.get("polls", []):
        sessions[(pl["consumer"], pl["session"], pl["topic"], pl["p"])].append(pl)
        committed = pl.get("committed", False)
        at = co_at if committed else un_at
        if at.get((pl["topic"], pl["p"]), {}).get(pl["o"]) != pl["v"]:
            r.add("read-then-gone", {"topic": pl["topic"], "p": pl["p"], "o": pl["o"],
                                     "value": pl["v"],
                                     "final_at_offset": at.get((pl["topic"], pl["p"]), {}).get(pl["o"]),
                                     "final_places": (co_where if committed else un_where).get(pl["v"], [])})
        if committed:
            s = txn_status.get(_txn_of(pl["v"]))
            if s == "aborted":
                r.add("aborted-read", {"txn": _txn_of(pl["v"]), "value": pl["v"],
                                       "at": (pl["topic"], pl["p"], pl["o"]), "by": pl["consumer"]})
    for (consumer, session, topic, p), polls in sessions.items():
        committed = polls[0].get("committed", False)
        offsets = sorted((co_at if committed else un_at).get((topic, p), {}))
        for prev, cur in zip(polls, polls[1:]):
            if cur["o"] <= prev["o"]:
                r.add("poll-back", {"consumer": consumer, "session": session, "topic": topic,
                                    "p": p, "from": prev["o"], "to": cur["o"]})
                continue
            i = bisect.bisect_right(offsets, prev["o"])
            if i < len(offsets) and offsets[i] < cur["o"]:
                r.add("poll-skip", {"consumer": consumer, "session": session, "topic": topic,
                                    "p": p, "from": prev["o"], "to": cur["o"],
                                    "skipped": offsets[i]})

    # Committed group offsets never go backwards.
    last = {}
    for c in sorted(history.get("commits", []), key=lambda c: c["t"]):
        key = (c["group"], c["topic"], c["p"])
        if key in last and c["o"] < last[key]["o"]:
            r.add("offset-backwards", {"group": key[0], "topic": key[1], "p": key[2],
                                       "from": last[key]["o"], "to": c["o"]})
        if key not in last or c["o"] >= last[key]["o"]:
            last[key] = c
    for group, topics in final.get("group_offsets", {}).items():
        for topic, parts in topics.items():
            for p, o in parts.items():
                prev = last.get((group, topic, p))
                if prev is not None and o < prev["o"]:
                    r.add("offset-backwards", {"group": group, "topic": topic, "p": p,
                                               "from": prev["o"], "to": o, "by": "final"})

    # A queue: every acknowledged record below the final committed offset was
    # delivered to some member of the group.
    polled = defaultdict(set)
    for pl in history.get("polls", []):
        polled[pl["group"]].add(pl["v"])
    for group, topics in final.get("group_offsets", {}).items():
        for a in history.get("acks", []):
            if a.get("txn") is not None:
                continue
            end = topics.get(a["topic"], {}).get(a["p"])
            if end is not None and a["o"] is not None and a["o"] < end and a["v"] not in polled[group]:
                r.add("unconsumed", {"group": group, "topic": a["topic"], "p": a["p"],
                                     "o": a["o"], "value": a["v"]})

    # Faults, and the failover pause each caused: per partition, the time
    # from the fault to the first acknowledgement of a record sent after it;
    # the fault's pause is the longest of its partitions'.
    acks_of = defaultdict(list)
    for a in history.get("acks", []):
        if a.get("sent") is not None:
            acks_of[(a["topic"], a["p"])].append((a["sent"], a["t"]))
    for key in acks_of:
        acks_of[key].sort()
    for f in history.get("faults", []):
        r.faults[f["kind"]] += 1
        waits = []
        for acks in acks_of.values():
            i = bisect.bisect_left(acks, (f["t"], float("-inf")))
            later = [t for _, t in acks[i:i + 200]]
            if later:
                waits.append(min(later) - f["t"])
        if waits:
            r.pauses[f["kind"]].append(max(waits))
    return r


def _txn_of(value: str) -> str | None:
    """The transaction a txn workload value belongs to: values are
    ``t:<producer>:<txn number>:<i>`` and txn ids ``<producer>:<txn number>``."""
    parts = value.split(":")
    return f"{parts[1]}:{parts[2]}" if len(parts) >= 4 and parts[0] == "t" else None


def render(r: Report, minutes: float | None = None) -> str:
    lines = []
    if minutes is not None:
        lines.append(f"minutes of faults: {minutes:.1f}")
    lines.append(f"records acknowledged: {r.acked}; records read back: {r.read_back}; "
                 f"transactions: {dict(r.txns)}")
    lines.append("")
    lines.append(f"{'fault':<18}{'count':>7}{'pause p50 s':>13}{'pause p99 s':>13}")
    for kind in sorted(r.faults):
        p50, p99 = percentile(r.pauses[kind], 0.5), percentile(r.pauses[kind], 0.99)
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"{kind:<18}{r.faults[kind]:>7}{fmt(p50):>13}{fmt(p99):>13}")
    lines.append("")
    lines.append(f"{'anomaly':<18}{'count':>7}  first examples")
    for kind in KINDS:
        n = r.counts.get(kind, 0)
        ex = "; ".join(str(e) for e in r.anomalies.get(kind, [])[:3]) if n else ""
        lines.append(f"{kind:<18}{n:>7}  {ex}")
    lines.append("")
    lines.append("RESULT: " + ("no anomalies" if r.ok else
                               f"{sum(r.counts.values())} anomalies"))
    return "\n".join(lines)
