"""The web console on the admin port: its page and assets from the binary,
and the JSON API its pages read, against records real clients wrote, on
one node and on a cluster (partitions led by other nodes), tried with bad
input and as users the ACLs limit."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from helpers import create_topic, sasl_conf, unique_topic
from test_admin_http import call, secured_broker  # noqa: F401 - the SASL + ACL broker fixture
from test_cluster import cluster, eventually  # noqa: F401 - the 3-node cluster fixture


def tessera_only(broker):
    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera" or not broker.has_admin_http:
        pytest.skip("tessera's console")


class Url:
    """An admin base URL, as the cluster fixture gives them."""

    def __init__(self, base: str):
        self.base = base

    def admin_url(self, path: str) -> str:
        return self.base + path


def api(broker, path, user=None, password=None):
    status, headers, body = call(broker, "GET", "/api/v1/" + path, user, password)
    return status, (json.loads(body) if headers.get("Content-Type", "").startswith("application/json") else body)


def ok(broker, path, user=None, password=None):
    status, body = api(broker, path, user, password)
    assert status == 200, (path, status, body)
    return body


def produce(bootstrap, topic, records, extra=None):
    """Each (partition, key, value, headers) acknowledged with acks=all."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", **(extra or {})})
    failures = []
    for partition, key, value, headers in records:
        p.produce(topic, key=key, value=value, headers=headers, partition=partition,
                  on_delivery=lambda err, _m: err and failures.append(err))
    assert p.flush(60) == 0 and not failures, failures


def test_the_console_shows_a_node_its_topics_and_their_messages(broker):
    tessera_only(broker)
    topic = unique_topic("console")
    create_topic(broker, topic, partitions=2)
    big = b"v" * 10_000
    records = [(0, f"k{i}".encode(), json.dumps({"n": i}).encode(), [("h", b"x")]) for i in range(30)]
    records += [(0, b"bin", bytes([0xFF, 0x00, 0x10]), None), (0, b"big", big, None), (1, None, b"one", None)]
    produce(broker.bootstrap, topic, records)

    status, headers, page = call(broker, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html"), (status, headers)
    assert "Tessera console" in page and "/console/app.js" in page
    assert "frame-ancestors 'none'" in headers.get("Content-Security-Policy", "")
    for asset, kind in [("/console/app.js", "text/javascript"), ("/console/app.css", "text/css")]:
        status, headers, _ = call(broker, "GET", asset)
        assert status == 200 and headers["Content-Type"].startswith(kind), (asset, status, headers)

    session = ok(broker, "session")
    assert session["principal"] == "User:ANONYMOUS" and session["messages_enabled"] is True
    cluster_view = ok(broker, "cluster")
    assert [b["id"] for b in cluster_view["brokers"]] == [session["node_id"]]
    assert cluster_view["brokers"][0]["fenced"] is False and cluster_view["brokers"][0]["voter"] is True
    assert cluster_view["topics"] >= 1 and cluster_view["offline_partitions"] == 0

    listed = ok(broker, "topics?search=" + urllib.parse.quote(topic.upper()))
    assert [t["name"] for t in listed] == [topic], listed
    assert listed[0]["partitions"] == 2 and listed[0]["internal"] is False
    assert ok(broker, "topics?search=no-such-topic-anywhere") == []

    view = ok(broker, "topics/" + urllib.parse.quote(topic))
    ends = {p["partition"]: (p["log_start"], p["log_end"]) for p in view["partitions"]}
    assert ends == {0: (0, 32), 1: (0, 1)}, ends
    assert all(p["leader"] == session["node_id"] for p in view["partitions"])
    assert view["ranges"] and all(r["segments"] for r in view["ranges"])
    configs = {c["name"]: c for c in view["configs"]}
    assert configs["cleanup.policy"]["value"] == "delete"
    assert configs["cleanup.policy"]["source"] == "DEFAULT_CONFIG"

    base = f"topics/{urllib.parse.quote(topic)}/partitions/0/messages"
    oldest = ok(broker, base + "?limit=5")
    assert [m["offset"] for m in oldest["messages"]] == [0, 1, 2, 3, 4]
    assert oldest["next"] == 5 and oldest["log_end"] == 32
    first = oldest["messages"][0]
    assert first["key"]["text"] == "k0" and json.loads(first["value"]["text"]) == {"n": 0}
    assert first["headers"] == [["h", {"text": "x", "size": 1, "truncated": False}]]

    newest = ok(broker, base + "?newest=true&limit=3")
    assert [m["offset"] for m in newest["messages"]] == [31, 30, 29]
    binary = newest["messages"][1]
    assert binary["value"]["hex"] == "ff0010" and "text" not in binary["value"]
    cut = newest["messages"][0]
    assert cut["value"]["truncated"] is True and cut["value"]["size"] == 10_000
    assert len(cut["value"]["text"]) < 10_000
    whole = ok(broker, base + "?offset=31&limit=1&full=true")["messages"][0]
    assert whole["value"]["text"] == big.decode() and whole["value"]["truncated"] is False

    assert [m["offset"] for m in ok(broker, base + "?offset=10&limit=2")["messages"]] == [10, 11]
    found = ok(broker, base + "?q=" + urllib.parse.quote('"n": 17'))["messages"]
    assert [m["offset"] for m in found] == [17], found
    by_time = ok(broker, base + f"?timestamp={first['timestamp']}&limit=1")["messages"]
    assert by_time[0]["offset"] == 0
    assert ok(broker, base + "?offset=32")["messages"] == []

    # Bad input: a clear error, and the broker keeps serving.
    for path, expected in [
        ("topics/no-such-topic", 404),
        (f"topics/{topic}/partitions/7/messages", 404),
        (f"topics/{topic}/partitions/x/messages", 400),
        (base + "?offset=abc", 400),
        (base + "?limit=-1", 400),
        ("no/such/api", 404),
    ]:
        status, body = api(broker, path)
        assert status == expected and body["error"], (path, status, body)
    assert call(broker, "POST", "/api/v1/cluster")[0] == 403, "a write without the CSRF token"
    token = ok(broker, "session")["csrf_token"]
    assert post(broker, "cluster", {}, token)[0] == 404
    assert call(broker, "PUT", "/api/v1/cluster")[0] == 405
    assert ok(broker, "cluster")["brokers"]


def test_any_node_of_a_cluster_shows_partitions_led_by_the_others(cluster):
    boot = cluster["bootstrap"]
    topic = unique_topic("console-cluster")
    a = AdminClient({"bootstrap.servers": boot[0]})
    a.create_topics([NewTopic(topic, 3, 3)], request_timeout=30)[topic].result(30)
    leaders = eventually(
        f"{topic} led on three nodes",
        lambda: (t := a.list_topics(topic, timeout=10).topics.get(topic)) is not None
        and t.error is None and len(t.partitions) == 3
        and all(p.leader > 0 for p in t.partitions.values())
        and {p.id: p.leader for p in t.partitions.values()},
    )
    produce(",".join(boot), topic, [(p, None, f"p{p}-{i}".encode(), None) for p in range(3) for i in range(p + 2)])
    for node, base in enumerate(cluster["admin"]):
        n = Url(base)
        view = ok(n, "cluster")
        assert view["node_id"] == node + 1 and len(view["brokers"]) == 3
        assert all(b["voter"] for b in view["brokers"]), "three nodes, three voters"
        assert sum(b["controller"] for b in view["brokers"]) == 1
        page = ok(n, f"topics/{topic}")
        assert {p["partition"]: p["leader"] for p in page["partitions"]} == leaders
        assert {p["partition"]: p["log_end"] for p in page["partitions"]} == {0: 2, 1: 3, 2: 4}, page
        for p in range(3):
            got = ok(n, f"topics/{topic}/partitions/{p}/messages")
            assert got["leader"] == leaders[p]
            assert [m["value"]["text"] for m in got["messages"]] == [f"p{p}-{i}" for i in range(p + 2)]
    assert len(set(leaders.values())) > 1, f"partitions spread over nodes: {leaders}"
    group = unique_topic("console-cluster-group")
    consume_and_commit(",".join(boot), topic, group, 9).close()
    for base in cluster["admin"]:
        n = Url(base)
        eventually(f"{group} listed by {base}", lambda: [g for g in ok(n, "groups") if g["group_id"] == group])
        page = ok(n, f"groups/{group}")
        assert sorted((o["partition"], o["committed"], o["lag"]) for o in page["offsets"]) == [
            (0, 2, 0), (1, 3, 0), (2, 4, 0)], page


def test_the_console_shows_only_what_the_acls_allow(secured_broker):
    b = secured_broker
    seen, hidden = unique_topic("console-seen"), unique_topic("console-hidden")
    for t in (seen, hidden):
        create_topic(b, t, partitions=1)
    produce(b.bootstrap, seen, [(0, b"k", b"secret-value", None)])

    # No credentials or wrong ones: 401 with a Basic challenge (the browser
    # asks for a login), for the page and the API alike.
    for path in ["/", "/api/v1/cluster", "/api/v1/topics", f"/api/v1/topics/{seen}/partitions/0/messages"]:
        status, headers, _ = call(b, "GET", path)
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Basic"), (path, status)
        assert call(b, "GET", path, "alice", "wrong")[0] == 401

    # alice (PLAIN) has no ACL: she sees the brokers, no topic, and an
    # unknown topic's answer for one she may not describe.
    assert ok(b, "session", "alice", "alice-secret")["principal"] == "User:alice"
    assert ok(b, "cluster", "alice", "alice-secret")["brokers"]
    assert ok(b, "topics", "alice", "alice-secret") == []
    assert api(b, f"topics/{seen}", "alice", "alice-secret")[0] == 404
    assert api(b, f"topics/{seen}/partitions/0/messages", "alice", "alice-secret")[0] == 404

    admin = AdminClient(sasl_conf(b, "PLAIN", "admin", "admin-secret"))

    def grant(op):
        binding = AclBinding(ResourceType.TOPIC, seen, ResourcePatternType.LITERAL, "User:alice", "*",
                             op, AclPermissionType.ALLOW)
        for f in admin.create_acls([binding], request_timeout=30).values():
            f.result(timeout=30)

    grant(AclOperation.DESCRIBE)
    assert [t["name"] for t in ok(b, "topics", "alice", "alice-secret")] == [seen]
    view = ok(b, f"topics/{seen}", "alice", "alice-secret")
    assert view["configs"] is None, "no DESCRIBE_CONFIGS"
    status, body = api(b, f"topics/{seen}/partitions/0/messages", "alice", "alice-secret")
    assert status == 403 and "not allowed to read" in body["error"].lower(), (status, body)
    grant(AclOperation.READ)
    got = ok(b, f"topics/{seen}/partitions/0/messages", "alice", "alice-secret")
    assert [m["value"]["text"] for m in got["messages"]] == ["secret-value"]
    assert api(b, f"topics/{hidden}", "alice", "alice-secret")[0] == 404
    # Writes need what the Kafka API would: alice may neither create nor
    # delete (her token is hers: admin's is refused for her).
    alice_token = ok(b, "session", "alice", "alice-secret")["csrf_token"]
    admin_token = ok(b, "session", "admin", "admin-secret")["csrf_token"]
    assert alice_token != admin_token
    assert post(b, f"topics/{seen}/delete", {}, admin_token, "alice", "alice-secret")[0] == 403
    status, body = post(b, f"topics/{seen}/delete", {}, alice_token, "alice", "alice-secret")
    assert status == 403 and "not allowed" in body["error"], (status, body)
    status, body = post(b, "topics", {"name": unique_topic("alice")}, alice_token, "alice", "alice-secret")
    assert status == 403, (status, body)
    assert api(b, f"topics/{seen}", "alice", "alice-secret")[0] == 200
    (range_id,) = [r["id"] for r in ok(b, f"topics/{seen}", "admin", "admin-secret")["ranges"]]
    status, body = post(b, f"ranges/{range_id}/split", {}, alice_token, "alice", "alice-secret")
    assert status == 403 and "ALTER the cluster" in body["error"], (status, body)
    # The super user sees both.
    names = {t["name"] for t in ok(b, "topics", "admin", "admin-secret")}
    assert {seen, hidden} <= names


def test_the_console_can_be_turned_off_or_hide_message_contents(broker_factory):
    off = broker_factory(overrides={"console.enable": "false"})
    tessera_only(off)
    assert call(off, "GET", "/")[0] == 404
    assert call(off, "GET", "/api/v1/cluster")[0] == 404
    assert call(off, "GET", "/health")[0] == 200

    hidden = broker_factory(overrides={"console.messages.enable": "false", "console.read.only": "true"})
    topic = unique_topic("console-hidden")
    create_topic(hidden, topic, partitions=1)
    produce(hidden.bootstrap, topic, [(0, b"k", b"v", None)])
    session = ok(hidden, "session")
    assert session["messages_enabled"] is False and session["read_only"] is True
    assert ok(hidden, f"topics/{topic}")["partitions"][0]["log_end"] == 1
    status, body = api(hidden, f"topics/{topic}/partitions/0/messages")
    assert status == 403 and "console.messages.enable" in body["error"], (status, body)
    status, body = post(hidden, f"topics/{topic}/delete", {}, session["csrf_token"])
    assert status == 403 and "read-only" in body["error"], (status, body)
    assert ok(hidden, f"topics/{topic}")["partitions"], "still there"


def consume_and_commit(bootstrap, topic, group, count):
    """A consumer of `group` that read and committed `count` records of
    `topic`, still in the group (the caller closes it)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "client.id": "console-test"})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < count and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got += 1
    assert got == count, got
    c.commit(asynchronous=False)
    return c


def test_the_console_shows_groups_their_members_and_lag(broker):
    tessera_only(broker)
    topic, group = unique_topic("console-lag"), unique_topic("console-group")
    create_topic(broker, topic, partitions=1)
    produce(broker.bootstrap, topic, [(0, None, b"r%d" % i, None) for i in range(10)])
    consumer = consume_and_commit(broker.bootstrap, topic, group, 10)
    try:
        produce(broker.bootstrap, topic, [(0, None, b"late%d" % i, None) for i in range(4)])
        listed = eventually(f"{group} listed Stable", lambda: [
            g for g in ok(broker, "groups") if g["group_id"] == group and g["state"] == "Stable"])
        assert listed[0]["protocol_type"] == "consumer", listed
        page = ok(broker, "groups/" + urllib.parse.quote(group))
        assert page["state"] == "Stable" and len(page["members"]) == 1, page
        member = page["members"][0]
        assert member["client_id"] == "console-test" and member["assignment"] == [[topic, [0]]], member
        assert page["offsets"] == [{"topic": topic, "partition": 0, "committed": 10, "log_end": 14, "lag": 4}]
        assert page["total_lag"] == 4
    finally:
        consumer.close()
    empty = eventually(f"{group} empty", lambda: (p := ok(broker, "groups/" + group))["state"] == "Empty" and p)
    assert empty["members"] == [] and empty["total_lag"] == 4
    assert api(broker, "groups/no-such-group")[0] == 404


def post(broker, path, body, token=None, user=None, password=None, raw=None):
    """(status, json) of a console write."""
    import base64
    import urllib.error
    import urllib.request

    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(broker.admin_url("/api/v1/" + path), method="POST", data=data)
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("X-Tessera-CSRF", token)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_the_console_writes_topics_with_kafkas_validation_and_a_csrf_token(broker):
    tessera_only(broker)
    token = ok(broker, "session")["csrf_token"]
    topic = unique_topic("console-made")
    new = {"name": topic, "partitions": 2, "configs": {"retention.ms": "3600000"}}
    # No token, a wrong one: refused, nothing created.
    assert post(broker, "topics", new)[0] == 403
    status, body = post(broker, "topics", new, token="0" * 64)
    assert status == 403 and "CSRF" in body["error"], body
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert topic not in a.list_topics(timeout=10).topics

    status, body = post(broker, "topics", new, token)
    assert status == 200 and body["partitions"] == 2, body
    listed = a.list_topics(topic, timeout=10).topics[topic]
    assert listed.error is None and len(listed.partitions) == 2
    from confluent_kafka.admin import ConfigResource
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = a.describe_configs([resource])[resource].result(30)
    assert described["retention.ms"].value == "3600000"

    # Kafka's validation, with Kafka's messages and codes.
    for bad, code in [
        ({"name": topic}, 36),                                  # TOPIC_ALREADY_EXISTS
        ({"name": "bad name!"}, 17),                            # INVALID_TOPIC_EXCEPTION
        ({"name": unique_topic("rf"), "replication_factor": 3}, 38),  # INVALID_REPLICATION_FACTOR
        ({"name": unique_topic("cfg"), "configs": {"retention.ms": "soon"}}, 40),  # INVALID_CONFIG
        ({"name": unique_topic("none"), "partitions": 0}, 37),  # INVALID_PARTITIONS
    ]:
        status, body = post(broker, "topics", bad, token)
        assert status == 400 and body["code"] == code and body["error"], (bad, status, body)
    assert post(broker, "topics", None, token, raw=b"{not json")[0] == 400
    assert post(broker, "topics", None, token, raw=b"x" * (70 << 10))[0] == 413

    path = "topics/" + urllib.parse.quote(topic)
    assert post(broker, path + "/configs", {"set": {"cleanup.policy": "compact"}}, token)[0] == 200
    assert a.describe_configs([resource])[resource].result(30)["cleanup.policy"].value == "compact"
    status, body = post(broker, path + "/configs", {"set": {"cleanup.policy": "sometimes"}}, token)
    assert status == 400 and body["code"] == 40, body
    assert post(broker, path + "/configs", {"delete": ["cleanup.policy"]}, token)[0] == 200
    assert a.describe_configs([resource])[resource].result(30)["cleanup.policy"].value == "delete"

    assert post(broker, path + "/partitions", {"count": 4}, token)[0] == 200
    assert len(a.list_topics(topic, timeout=10).topics[topic].partitions) == 4
    status, body = post(broker, path + "/partitions", {"count": 3}, token)
    assert status == 400 and body["code"] == 37, body  # INVALID_PARTITIONS

    assert post(broker, "topics/__consumer_offsets/delete", {}, token)[0] in (400, 404)
    assert post(broker, path + "/delete", {}, token)[0] == 200
    eventually(f"{topic} gone", lambda: topic not in a.list_topics(timeout=10).topics)
    assert api(broker, path)[0] == 404
    assert ok(broker, "cluster")["brokers"], "the broker serves on"


def test_the_console_splits_and_merges_ranges_and_shows_live_rates(broker):
    tessera_only(broker)
    token = ok(broker, "session")["csrf_token"]
    topic = unique_topic("console-ranges")
    create_topic(broker, topic, partitions=4)
    produce(broker.bootstrap, topic, [(p, None, b"before", None) for p in range(4)])
    path = "topics/" + urllib.parse.quote(topic)
    (only,) = [r for r in ok(broker, path)["ranges"] if r["active"]]
    assert post(broker, f"ranges/{only['id']}/split", {"at": 9}, token)[0] == 409, "outside the range"
    assert post(broker, "ranges/x/split", {}, token)[0] == 400
    status, body = post(broker, f"ranges/{only['id']}/split", {"at": 1}, token)
    assert status == 200, body
    left, right = body["children"]
    active = sorted((r["id"], r["lo"], r["hi"]) for r in ok(broker, path)["ranges"] if r["active"])
    assert active == [(left, 0, 1), (right, 1, 4)], active
    assert [r["parents"] for r in ok(broker, path)["ranges"] if r["id"] == right] == [[only["id"]]]
    produce(broker.bootstrap, topic, [(p, None, b"between", None) for p in range(4)])
    status, body = post(broker, "ranges/merge", {"left": left, "right": right}, token)
    assert status == 200, body
    active = [r for r in ok(broker, path)["ranges"] if r["active"]]
    assert [(r["id"], r["lo"], r["hi"]) for r in active] == [(body["child"], 0, 4)], active
    produce(broker.bootstrap, topic, [(p, None, b"after", None) for p in range(4)])
    page = ok(broker, path)
    assert [p["log_end"] for p in page["partitions"]] == [3, 3, 3, 3], "offsets dense through both moves"
    values = [m["value"]["text"] for m in ok(broker, path + "/partitions/2/messages")["messages"]]
    assert values == ["before", "between", "after"], values

    rates = ok(broker, "rates")
    assert rates["produced_bytes"] > 0 and rates["open_connections"] >= 0
    assert rates["node_id"] == ok(broker, "session")["node_id"]
    assert topic in rates["topic_bytes_in_per_sec"]


def test_the_console_resets_and_deletes_only_empty_groups(broker):
    tessera_only(broker)
    token = ok(broker, "session")["csrf_token"]
    topic, group = unique_topic("console-reset"), unique_topic("console-reset-group")
    create_topic(broker, topic, partitions=1)
    produce(broker.bootstrap, topic, [(0, None, b"r%d" % i, None) for i in range(10)])
    consumer = consume_and_commit(broker.bootstrap, topic, group, 10)
    path = "groups/" + urllib.parse.quote(group)
    try:
        status, body = post(broker, path + "/offsets", {"topic": topic, "to": "earliest"}, token)
        assert status == 409 and "active members" in body["error"], body
        status, body = post(broker, path + "/delete", {}, token)
        assert status == 409 and "active members" in body["error"], body
    finally:
        consumer.close()
    eventually(f"{group} empty", lambda: ok(broker, path)["state"] == "Empty")
    assert post(broker, path + "/offsets", {"topic": topic, "to": "earliest"}, token)[0] == 200
    assert ok(broker, path)["offsets"][0]["committed"] == 0
    assert post(broker, path + "/offsets", {"topic": topic, "to": "offset", "value": 7}, token)[0] == 200
    page = ok(broker, path)
    assert (page["offsets"][0]["committed"], page["total_lag"]) == (7, 3), page
    assert post(broker, path + "/offsets", {"topic": topic, "to": "sideways"}, token)[0] == 400
    # A consumer of the group resumes where the reset put it.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.subscribe([topic])
    first = None
    deadline = time.monotonic() + 60
    while first is None and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            first = m.offset()
    c.close()
    assert first == 7, first
    eventually(f"{group} empty again", lambda: ok(broker, path)["state"] == "Empty")
    assert post(broker, path + "/delete", {}, token)[0] == 200
    assert api(broker, path)[0] == 404


def test_the_console_pages_work_in_a_browser(broker, tmp_path):
    """Debian's chromium driven by playwright-core (scripts/test.sh installs
    both): the pages render from the binary's assets, navigate, search and
    browse messages newest first, with no script error."""
    tessera_only(broker)
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if os.environ.get("TESSERA_SKIP_BROWSER") == "1":
        pytest.skip("TESSERA_SKIP_BROWSER=1")
    assert os.path.exists(chromium), f"{chromium} missing: scripts/test.sh installs Debian's chromium"
    topic = unique_topic("console-browser")
    create_topic(broker, topic, partitions=1)
    produce(broker.bootstrap, topic, [(0, f"k{i}".encode(), json.dumps({"n": i}).encode(), None)
                                      for i in range(12)])
    group = unique_topic("console-browser-group")
    consume_and_commit(broker.bootstrap, topic, group, 12).close()
    node_dir = Path(__file__).resolve().parent.parent / "node"
    out = subprocess.run(
        ["node", str(node_dir / "console_browser.js"), broker.admin_url(""), topic,
         str(tmp_path / "console.png"), group],
        capture_output=True, timeout=180, cwd=node_dir, env={**os.environ, "CHROMIUM": chromium},
    )
    assert out.returncode == 0, (out.stdout.decode(errors="replace")[-3000:],
                                 out.stderr.decode(errors="replace")[-3000:])
    seen = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert "Brokers" in seen["cluster"] and "live" in seen["cluster"]
    assert topic in seen["topics"]
    assert topic + "-made" in seen["created"]
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert len(a.list_topics(topic + "-made", timeout=10).topics[topic + "-made"].partitions) == 3
    assert "Partitions" in seen["topic"] and "Configs" in seen["topic"]
    assert '"n": 0' in seen["messages"] and '"n": 11' in seen["messages"], seen["messages"][:2000]
    assert seen["newest_first"] == list(range(11, -1, -1)), seen["newest_first"]
    assert "total lag" in seen["group"] and topic in seen["group"], seen["group"][:2000]
    assert "browser-user" in seen["access"] and "browser-secret" not in seen["access"]
    assert "produced" in seen["live"] and seen["live_charts"] >= 4, seen["live"][:1000]
    assert seen["errors"] == []
    assert (tmp_path / "console.png").stat().st_size > 0


def test_the_console_manages_acls_and_scram_users_for_those_allowed(secured_broker):
    b = secured_broker
    admin_token = ok(b, "session", "admin", "admin-secret")["csrf_token"]
    topic = unique_topic("console-acl")
    create_topic(b, topic, partitions=1)
    acl = {"resource_type": "TOPIC", "resource_name": topic, "pattern_type": "LITERAL",
           "principal": "User:carol", "host": "*", "operation": "READ", "permission": "ALLOW"}

    # alice may not describe the cluster: no ACL or user list, no change.
    alice_token = ok(b, "session", "alice", "alice-secret")["csrf_token"]
    assert api(b, "acls", "alice", "alice-secret")[0] == 403
    assert api(b, "users", "alice", "alice-secret")[0] == 403
    assert post(b, "acls", acl, alice_token, "alice", "alice-secret")[0] == 403

    status, body = post(b, "acls", acl, admin_token, "admin", "admin-secret")
    assert status == 200, body
    assert acl in ok(b, "acls", "admin", "admin-secret")
    admin = AdminClient(sasl_conf(b, "PLAIN", "admin", "admin-secret"))
    from confluent_kafka.admin import AclBindingFilter
    found = admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                                                 None, None, AclOperation.ANY, AclPermissionType.ANY),
                                request_timeout=30).result(30)
    assert [(x.principal, x.operation) for x in found] == [("User:carol", AclOperation.READ)], found
    for bad in [{**acl, "operation": "JUMP"}, {**acl, "principal": "carol"}, {**acl, "pattern_type": "MATCH"}]:
        status, body = post(b, "acls", bad, admin_token, "admin", "admin-secret")
        assert status == 400 and body["error"], (bad, status, body)
    status, body = post(b, "acls/delete", acl, admin_token, "admin", "admin-secret")
    assert status == 200 and body["deleted"] == 1, body
    assert acl not in ok(b, "acls", "admin", "admin-secret")

    # A SCRAM user made in the console logs in on the Kafka listener and on
    # the admin port; its secrets are never shown; removed, it cannot.
    user = {"name": "dave", "mechanism": "SCRAM-SHA-256", "password": "dave-secret"}
    assert post(b, "users", {**user, "password": ""}, admin_token, "admin", "admin-secret")[0] == 400
    assert post(b, "users", {**user, "mechanism": "MD5"}, admin_token, "admin", "admin-secret")[0] == 400
    status, body = post(b, "users", user, admin_token, "admin", "admin-secret")
    assert status == 200, body
    listed = ok(b, "users", "admin", "admin-secret")
    assert {"name": "dave", "mechanism": "SCRAM-SHA-256", "iterations": 4096} in listed, listed
    _, _, raw = call(b, "GET", "/api/v1/users", "admin", "admin-secret")
    assert "salt" not in raw and "key" not in raw and "dave-secret" not in raw
    dave = AdminClient(sasl_conf(b, "SCRAM-SHA-256", "dave", "dave-secret"))
    assert dave.list_topics(timeout=20) is not None
    assert ok(b, "session", "dave", "dave-secret")["principal"] == "User:dave"
    status, body = post(b, "users/delete", {"name": "dave", "mechanism": "SCRAM-SHA-256"},
                        admin_token, "admin", "admin-secret")
    assert status == 200, body
    assert call(b, "GET", "/api/v1/session", "dave", "dave-secret")[0] == 401

    # Client quotas: as AlterClientQuotas and DescribeClientQuotas (which
    # need ALTER_CONFIGS and DESCRIBE_CONFIGS on the cluster).
    quota = {"user": "carol", "client_id": None, "key": "producer_byte_rate", "value": 1048576.0}
    assert api(b, "quotas", "alice", "alice-secret")[0] == 403
    assert post(b, "quotas", quota, alice_token, "alice", "alice-secret")[0] == 403
    status, body = post(b, "quotas", quota, admin_token, "admin", "admin-secret")
    assert status == 200, body
    assert quota in ok(b, "quotas", "admin", "admin-secret")
    default = {"user": "<default>", "client_id": None, "key": "consumer_byte_rate", "value": 2048.0}
    assert post(b, "quotas", default, admin_token, "admin", "admin-secret")[0] == 200
    assert default in ok(b, "quotas", "admin", "admin-secret")
    status, body = post(b, "quotas", {**quota, "key": "speed"}, admin_token, "admin", "admin-secret")
    assert status == 400 and body["error"], body
    assert post(b, "quotas", {**quota, "value": None}, admin_token, "admin", "admin-secret")[0] == 400
    for q in (quota, default):
        assert post(b, "quotas/delete", q, admin_token, "admin", "admin-secret")[0] == 200
    assert ok(b, "quotas", "admin", "admin-secret") == []


def test_the_console_speaks_tls_with_the_kafka_listeners_keys(broker_factory, tmp_path):
    """admin.listener.ssl.enable: the console and the rest of the admin
    port over TLS with the SSL listener's PEM keys; plain HTTP gets nothing."""
    import socket
    import ssl

    from tls_setup import make_certs, needs_openssl  # noqa: F401

    if os.environ.get("COMPAT_BROKER", "tessera") != "tessera":
        pytest.skip("tessera's console")
    make_certs(tmp_path)
    b = broker_factory(start=False)
    from conftest import free_port
    b.ssl_port = free_port()
    b.overrides.update({
        "listeners": f"PLAINTEXT://{b.host}:{b.port},SSL://{b.host}:{b.ssl_port}",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tmp_path / "keystore.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tmp_path / "ca.pem"),
        "admin.listener.ssl.enable": "true",
    })
    from conftest import tessera_bin
    out = subprocess.run([str(tessera_bin()), "--data-dir", str(b.data_dir), "users", "add", "bob",
                          "--password", "bob-secret"], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    b.start()
    import base64
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    def get(path, login=True):
        request = urllib.request.Request(f"https://127.0.0.1:{b.admin_port}{path}")
        if login:
            request.add_header("Authorization", "Basic " + base64.b64encode(b"bob:bob-secret").decode())
        with urllib.request.urlopen(request, context=context, timeout=10) as r:
            return r.status, r.read()

    # A TLS listener: no anonymous callers, the browser's Basic login.
    with pytest.raises(urllib.error.HTTPError) as refused:
        get("/api/v1/session", login=False)
    assert refused.value.code == 401
    status, body = get("/api/v1/session")
    assert status == 200 and json.loads(body)["principal"] == "User:bob"
    assert b"Tessera console" in get("/")[1]
    # Plain HTTP on the TLS port: no answer, and the port serves on.
    with socket.create_connection(("127.0.0.1", b.admin_port), timeout=10) as s:
        s.sendall(b"GET /api/v1/session HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(15)
        try:
            answer = s.recv(4096)
        except (ConnectionResetError, socket.timeout):
            answer = b""
        assert b"principal" not in answer and not answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert get("/api/v1/session")[0] == 200
