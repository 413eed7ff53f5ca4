"""The admin HTTP listener: /health, /ready, /metrics (Prometheus text),
and its ranges API answering only authenticated, authorized callers on a
broker that authenticates its Kafka clients (tried as an attacker would:
no credentials, wrong ones, a user the ACLs do not allow)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from conftest import free_port, tessera_bin
from helpers import create_topic, sasl_conf, unique_topic


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


JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'user_admin="admin-secret" user_alice="alice-secret";'
)


def call(broker, method, path, user=None, password=None):
    """(status, headers, body) of an admin request, with HTTP Basic
    credentials when `user` is given."""
    request = urllib.request.Request(broker.admin_url(path), method=method, data=b"" if method == "POST" else None)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode(errors="replace")


def refused_count(broker) -> float:
    _, _, body = call(broker, "GET", "/metrics")
    for line in body.splitlines():
        if line.startswith("tessera_admin_requests_refused_total "):
            return float(line.split()[1])
    raise AssertionError("tessera_admin_requests_refused_total missing")


@pytest.fixture
def secured_broker(broker_factory):
    """PLAINTEXT (the inter-broker listener, ANONYMOUS a super user there)
    and SASL_PLAINTEXT with PLAIN users admin (super user) and alice, a
    SCRAM user bob, an authorizer that denies what no ACL allows."""
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's admin port")
    b = broker_factory(start=False)
    b.sasl_port = free_port()
    b.overrides.update(
        {
            "listeners": f"PLAINTEXT://{b.host}:{b.port},SASL_PLAINTEXT://{b.host}:{b.sasl_port}",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin;User:ANONYMOUS",
        }
    )
    out = subprocess.run(
        [str(tessera_bin()), "--data-dir", str(b.data_dir), "users", "add", "bob",
         "--password", "bob-secret", "--mechanism", "SCRAM-SHA-256"],
        capture_output=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    b.start()
    b.sasl_bootstrap = f"{b.host}:{b.sasl_port}"
    return b


def ranges_of(broker, topic):
    status, _, body = call(broker, "GET", "/ranges", "admin", "admin-secret")
    assert status == 200, body
    return [r for r in json.loads(body) if r["topic"] == topic]


def test_the_ranges_api_answers_only_authorized_callers(secured_broker):
    b = secured_broker
    topic = unique_topic("admin-auth")
    create_topic(b, topic, partitions=4)
    (only,) = ranges_of(b, topic)
    refused_before = refused_count(b)
    split = f"/ranges/split?range={only['id']}"

    # Probes and metrics stay open.
    assert call(b, "GET", "/health")[0] == 200
    assert call(b, "GET", "/ready")[0] == 200

    # No credentials, wrong ones, another scheme: 401 with the challenge,
    # for reading and for splitting alike.
    for path, method in [("/ranges", "GET"), ("/segments", "GET"), ("/balance", "GET"),
                         (split, "POST")]:
        status, headers, body = call(b, method, path)
        assert status == 401, (path, status, body)
        assert headers.get("WWW-Authenticate", "").startswith("Basic"), headers
        assert call(b, method, path, "admin", "wrong")[0] == 401
        assert call(b, method, path, "nobody", "admin-secret")[0] == 401
        assert call(b, method, path, "bob", "alice-secret")[0] == 401
    bad_scheme = urllib.request.Request(b.admin_url("/ranges"), headers={"Authorization": "Bearer x"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad_scheme, timeout=10)
    assert e.value.code == 401

    # Authenticated but not allowed: alice (PLAIN) and bob (SCRAM) have no
    # ACL; DESCRIBE on the cluster lets bob read, not split.
    for user in ["alice", "bob"]:
        assert call(b, "GET", "/ranges", user, f"{user}-secret")[0] == 403
        assert call(b, "GET", "/balance", user, f"{user}-secret")[0] == 403
        status, _, body = call(b, "POST", split, user, f"{user}-secret")
        assert status == 403, body
        assert "may not ALTER the cluster" in body or "may not Alter the cluster" in body, body
    assert [r["id"] for r in ranges_of(b, topic)] == [only["id"]], "nothing was split"
    admin = AdminClient(sasl_conf(b, "PLAIN", "admin", "admin-secret"))
    grant = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:bob",
                       "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    for f in admin.create_acls([grant], request_timeout=30).values():
        f.result(timeout=30)
    status, _, body = call(b, "GET", "/ranges", "bob", "bob-secret")
    assert status == 200 and topic in body, body
    status, _, body = call(b, "GET", "/balance", "bob", "bob-secret")
    assert status == 200 and "decisions" in body, body
    assert call(b, "POST", split, "bob", "bob-secret")[0] == 403

    # Every refusal above was counted (17 x 401 + 2 x 3 + 1 x 403).
    assert refused_count(b) - refused_before >= 4 * 4 + 1 + 6 + 1

    # The super user splits; the CLI does the same with --user/--password
    # and fails without them.
    cli = [str(tessera_bin()), "ranges", "--admin", f"{b.host}:{b.admin_port}"]
    no_login = subprocess.run(cli + ["list"], capture_output=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if not k.startswith("TESSERA_ADMIN")})
    assert no_login.returncode != 0 and b"401" in no_login.stdout + no_login.stderr, no_login
    status, _, body = call(b, "POST", split, "admin", "admin-secret")
    assert status == 200, body
    children = json.loads(body)["children"]
    listed = subprocess.run(cli + ["--user", "admin", "--password", "admin-secret", "list"],
                            capture_output=True, timeout=60)
    assert listed.returncode == 0, listed.stderr.decode(errors="replace")
    assert topic in listed.stdout.decode()
    active = sorted(r["id"] for r in ranges_of(b, topic) if r["active"])
    assert active == sorted(children), (active, children)


def test_a_plaintext_broker_without_an_authorizer_keeps_the_ranges_api_open(broker):
    if not broker.has_admin_http:
        pytest.skip(f"{broker.kind} has no admin HTTP listener")
    status, _, body = call(broker, "GET", "/ranges")
    assert status == 200, body
    # Wrong credentials are still wrong.
    assert call(broker, "GET", "/ranges", "someone", "guess")[0] == 401
