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

import pytest

import procguard
from conftest import tessera_bin


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_no_arguments_serves_9092_with_data_under_cwd():
    if not (port_free(9092) and port_free(9644)):
        pytest.skip("127.0.0.1:9092 or :9644 is taken on this machine")
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
