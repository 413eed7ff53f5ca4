"""Produce throughput over TLS vs plaintext on one tessera: the same
confluent-kafka producer load (acks=all, 1 KiB values, idempotent) once
over the PLAINTEXT listener and once over an SSL listener (EC P-256
certificate made with the openssl CLI, TLS 1.3 by rustls), alternating
runs so machine noise hits both alike; prints MB/s, p99 delivery latency
and the TLS/plaintext ratio. Not a test.

    TESSERA_BIN=target/release/tessera .venv/bin/python bench/tls.py [--records N] [--runs R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "compat-tests" / "python"))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench import free_port  # noqa: E402
from tessera_proc import TesseraProc  # noqa: E402
from tls_setup import make_certs  # noqa: E402


def tessera_bin() -> Path:
    return Path(os.environ.get("TESSERA_BIN", HERE.parent / "target" / "release" / "tessera")).resolve()


def produce(conf: dict, topic: str, records: int, size: int) -> tuple[float, float]:
    """(MB/s, p99 ms) of `records` values of `size` bytes."""
    latencies = []
    p = Producer({**conf, "acks": "all", "linger.ms": 5, "enable.idempotence": True,
                  "queue.buffering.max.messages": 200_000})
    value = b"x" * size

    def done(err, msg):
        assert err is None, err
        latencies.append(msg.latency())

    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                p.produce(topic, value=value, on_delivery=done)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    elapsed = time.monotonic() - started
    latencies.sort()
    return records * size / elapsed / 1e6, latencies[int(len(latencies) * 0.99)] * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    certs = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    make_certs(certs)
    ssl_port = free_port()
    broker = TesseraProc(tessera_bin(), {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs / "keystore.pem"),
    }, prefix="bench-tls-", extra_listeners=f",SSL://127.0.0.1:{ssl_port}")
    broker.start()
    try:
        plain = {"bootstrap.servers": broker.bootstrap}
        tls = {"bootstrap.servers": f"127.0.0.1:{ssl_port}", "security.protocol": "SSL",
               "ssl.ca.location": str(certs / "ca.pem")}
        admin = AdminClient(plain)
        admin.create_topics([NewTopic("bench-tls", 3, 1)])["bench-tls"].result(60)
        time.sleep(1)
        for conf in (plain, tls):  # warm-up: connections, metadata, producer ids
            produce(conf, "bench-tls", 2_000, args.size)
        results = {"plaintext": [], "tls": []}
        for _ in range(args.runs):
            for name, conf in (("plaintext", plain), ("tls", tls)):
                results[name].append(produce(conf, "bench-tls", args.records, args.size))
        med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
               for k, v in results.items()}
        print("| listener | MB/s (median) | p99 ms (median) |")
        print("|---|---|---|")
        for k, (mbs, p99) in med.items():
            print(f"| {k} | {mbs:.1f} | {p99:.1f} |")
        print(f"TLS/plaintext throughput ratio: {med['tls'][0] / med['plaintext'][0]:.2f} "
              f"({args.runs} alternating runs of {args.records:,} x {args.size} B, acks=all)")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
