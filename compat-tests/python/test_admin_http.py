"""The admin HTTP listener: /health, /ready, /metrics (Prometheus text)."""

from __future__ import annotations

import urllib.request

import pytest


def get(broker, path):
    with urllib.request.urlopen(broker.admin_url(path), timeout=5) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode(errors="replace")


def test_health_ready_metrics(broker):
    if not broker.has_admin_http:
        pytest.skip(f"{broker.kind} has no admin HTTP listener")
    assert get(broker, "/health")[0] == 200
    assert get(broker, "/ready")[0] == 200
    status, ctype, body = get(broker, "/metrics")
    assert status == 200
    assert ctype.startswith("text/plain"), ctype
    assert "# TYPE" in body, body[:500]
