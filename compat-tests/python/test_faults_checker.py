"""The fault harness's checker (faults/checker.py) finds each anomaly it
claims to find, on synthetic histories (faults/selftest.py), and nothing in
a clean one. No broker is started."""

import pytest

from faults import checker, selftest


def test_a_clean_history_has_no_anomaly():
    r = checker.check(selftest.clean())
    assert r.ok, dict(r.counts)
    assert r.acked == 4 and r.faults == {"kill": 1}
    # the kill at t=1.5: the record sent at 1.9 is acknowledged at 2.0
    assert [round(x, 3) for x in r.pauses["kill"]] == [0.5]


@pytest.mark.parametrize("case", sorted(selftest.CASES))
def test_each_anomaly_is_found_alone(case):
    r = selftest.run_case(case)
    assert {k for k, n in r.counts.items() if n} == {selftest.expected(case)}, dict(r.counts)
    assert not r.ok and "RESULT: no anomalies" not in checker.render(r)
