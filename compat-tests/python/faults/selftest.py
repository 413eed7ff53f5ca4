"""Synthetic histories, each with exactly one kind of anomaly (and one with
none), so the checker is seen to fail on every anomaly it claims to find:
``faults.sh --self-test`` and test_faults_checker.py run them."""

from __future__ import annotations

import copy

from . import checker

Q, T, G = "queue", "txn", "queue-g"


def clean() -> dict:
    """Three queue records acknowledged, stored, polled and committed; a
    committed and an aborted transaction read back by read_committed."""
    acks = [{"t": 1.0 + i, "topic": Q, "p": 0, "o": i, "v": f"q:0:{i}", "txn": None,
             "sent": 0.9 + i} for i in range(3)]
    acks += [{"t": 2.5, "topic": T, "p": 0, "o": 0, "v": "t:0:1:0", "txn": "0:1"},
             {"t": 2.6, "topic": T, "p": 0, "o": 2, "v": "t:0:2:0", "txn": "0:2"}]
    polls = [{"consumer": "c1", "session": 1, "group": G, "topic": Q, "p": 0, "o": i,
              "v": f"q:0:{i}", "committed": False} for i in range(3)]
    polls.append({"consumer": "r1", "session": 1, "group": "txn-g", "topic": T, "p": 0,
                  "o": 0, "v": "t:0:1:0", "committed": True})
    return {
        "acks": acks,
        "txns": [{"id": "0:1", "status": "committed", "values": ["t:0:1:0"]},
                 {"id": "0:2", "status": "aborted", "values": ["t:0:2:0"]}],
        "polls": polls,
        "commits": [{"t": 4.0, "group": G, "topic": Q, "p": 0, "o": 2},
                    {"t": 5.0, "group": G, "topic": Q, "p": 0, "o": 3}],
        "faults": [{"kind": "kill", "t": 1.5}],
        "final": {
            # offsets 1 and 3 of txn-0 are the markers; 2 is the aborted record
            "uncommitted": {Q: {0: [[0, "q:0:0"], [1, "q:0:1"], [2, "q:0:2"]]},
                            T: {0: [[0, "t:0:1:0"], [2, "t:0:2:0"]]}},
            "committed": {Q: {0: [[0, "q:0:0"], [1, "q:0:1"], [2, "q:0:2"]]},
                          T: {0: [[0, "t:0:1:0"]]}},
            "group_offsets": {G: {Q: {0: 3}}},
        },
    }


def _uncommitted_q(h):
    return h["final"]["uncommitted"][Q][0]


def _both_q(h, records):
    h["final"]["uncommitted"][Q][0] = records
    h["final"]["committed"][Q][0] = copy.deepcopy(records)


def lost(h):
    _both_q(h, [[0, "q:0:0"], [1, "q:0:1"]])
    h["polls"] = h["polls"][:2]
    h["commits"] = h["commits"][:1]
    h["final"]["group_offsets"][G][Q][0] = 2


def duplicate(h):
    _both_q(h, _uncommitted_q(h) + [[3, "q:0:2"]])


def wrong_offset(h):
    _both_q(h, [[0, "q:0:0"], [1, "q:0:2"], [2, "q:0:1"]])
    for pl in h["polls"][1:3]:
        pl["o"] = 3 - pl["o"]
    h["polls"][1], h["polls"][2] = h["polls"][2], h["polls"][1]


def aborted_read(h):
    h["final"]["committed"][T][0].append([2, "t:0:2:0"])


def txn_missing(h):
    h["final"]["committed"][T][0] = []
    h["polls"] = h["polls"][:3]


def offset_backwards(h):
    h["commits"].append({"t": 6.0, "group": G, "topic": Q, "p": 0, "o": 1})


def offset_backwards_final(h):
    h["final"]["group_offsets"][G][Q][0] = 2


def poll_skip(h):
    # offset 1 reached the group through another member's session only
    skipped = h["polls"].pop(1)
    h["polls"].append(dict(skipped, consumer="c2"))


def poll_back(h):
    h["polls"].insert(2, dict(h["polls"][1]))


def read_then_gone(h):
    h["polls"].append({"consumer": "c1", "session": 1, "group": G, "topic": Q, "p": 0,
                       "o": 3, "v": "q:0:9", "committed": False})


def unconsumed(h):
    h["polls"] = [pl for pl in h["polls"] if pl["v"] != "q:0:0"]


def unavailable(h):
    h["final"]["unavailable"] = [{"topic": T, "p": 1, "error": "unknown partition"}]


def client_fatal(h):
    h["workers"] = [{"worker": "queue-producer-0", "what": "fatal",
                     "error": "OUT_OF_ORDER_SEQUENCE_NUMBER: sequence desynchronization"}]


CASES = {
    "lost": lost,
    "duplicate": duplicate,
    "wrong-offset": wrong_offset,
    "aborted-read": aborted_read,
    "txn-missing": txn_missing,
    "offset-backwards": offset_backwards,
    "offset-backwards-final": offset_backwards_final,
    "poll-skip": poll_skip,
    "poll-back": poll_back,
    "read-then-gone": read_then_gone,
    "unconsumed": unconsumed,
    "unavailable": unavailable,
    "client-fatal": client_fatal,
}


def expected(case: str) -> str:
    return "offset-backwards" if case == "offset-backwards-final" else case


def run_case(case: str) -> checker.Report:
    h = clean()
    CASES[case](h)
    return checker.check(h)


def run() -> bool:
    """Every case finds its anomaly and only it; the clean history none."""
    ok = True
    base = checker.check(clean())
    print(f"self-test clean: {dict(base.counts) or 'no anomalies'}")
    ok &= base.ok
    for case in CASES:
        r = run_case(case)
        found = {k for k, n in r.counts.items() if n}
        good = found == {expected(case)}
        ok &= good
        print(f"self-test {case:<24} found {sorted(found)} {'ok' if good else 'WRONG'}")
    return ok
