"""`tessera` started with no arguments on a clean directory: a single node on
127.0.0.1:9092 (admin HTTP on 127.0.0.1:9644) with its data under
./tessera-data, which Debian's kcat lists; SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import procguard
from conftest import tessera_bin


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_no_arguments_serves_9092_with_data_under_cwd():
    # A failure, not a skip: the defaults must be tested wherever the suite runs.
    busy = [p for p in (9092, 9644) if not port_free(p)]
    assert not busy, f"127.0.0.1 port(s) {busy} taken on this machine: cannot test the default listeners"
    workdir = Path(tempfile.mkdtemp(prefix="tessera-defaults-"))
    log = open(workdir / "tessera.log", "wb")
    proc = procguard.spawn([str(tessera_bin())], cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:9644/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (workdir / "tessera.log").read_text()
            assert time.monotonic() < deadline, "not ready within 30 s"
            time.sleep(0.1)
        kcat = os.environ.get("KCAT", "kcat")
        out = subprocess.run([kcat, "-b", "127.0.0.1:9092", "-L"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "broker 1 at 127.0.0.1:9092" in out.stdout, out.stdout
        assert (workdir / "tessera-data" / "meta.properties").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        procguard.kill(proc)
        log.close()


def test_a_kafka_kraft_server_properties_starts_tessera():
    """Kafka's own KRaft `server.properties` (its keys as shipped; ports made
    free, log.dirs under a temporary directory) starts tessera: keys that
    mean nothing here are logged as ignored, the CONTROLLER listener is the
    metadata quorum's (not a Kafka listener), `log.retention.hours` sets
    the topics' retention.ms, and clients produce and consume."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource

    from conftest import free_port

    kafka, controller, admin = free_port(), free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="tessera-properties-"))
    (workdir / "server.properties").write_text(f"""\
############################# Server Basics #############################
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
############################# Socket Server Settings #############################
listeners=PLAINTEXT://127.0.0.1:{kafka},CONTROLLER://127.0.0.1:{controller}
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://127.0.0.1:{kafka}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,\\
    SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
############################# Log Basics #############################
log.dirs={workdir / "kraft-combined-logs"}
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
#log.flush.interval.messages=10000
log.retention.hours=24
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
admin.listener=127.0.0.1:{admin}
""")
    log_path = workdir / "tessera.log"
    log = open(log_path, "wb")
    proc = procguard.spawn([str(tessera_bin()), "--config", str(workdir / "server.properties")],
                           cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "not ready within 30 s"
            time.sleep(0.1)
        bootstrap = f"127.0.0.1:{kafka}"
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        p.produce("from-properties", key=b"k", value=b"v")
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
        c.subscribe(["from-properties"])
        m = None
        deadline = time.monotonic() + 30
        while m is None and time.monotonic() < deadline:
            m = c.poll(1)
        c.close()
        assert m is not None and m.error() is None and m.value() == b"v"
        admin_client = AdminClient({"bootstrap.servers": bootstrap})
        [cfg] = admin_client.describe_configs([ConfigResource("topic", "from-properties")]).values()
        retention = cfg.result(timeout=30)["retention.ms"]
        assert (retention.value, retention.source) == (str(24 * 3_600_000), 4), retention  # STATIC_BROKER_CONFIG
        assert (workdir / "kraft-combined-logs" / "meta.properties").exists()
        text = log_path.read_text(errors="replace")
        assert "have no effect in tessera are ignored" in text and "num.io.threads" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        procguard.kill(proc)
        log.close()
