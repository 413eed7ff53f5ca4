"""One tessera process for the benchmarks that drive tessera alone
(ranges.py, range_moves.py): free loopback ports, a temporary data dir, a
log file, started through procguard, ready once /ready answers 200, and the
admin HTTP port."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench import free_port, terminate_then_kill
import procguard  # noqa: E402  (on sys.path through bench)


class TesseraProc:
    def __init__(self, binary: Path, overrides: dict[str, str] | None = None,
                 prefix: str = "bench-tessera-", extra_listeners: str = ""):
        self.binary, self.overrides = binary, dict(overrides or {})
        # More listeners after the PLAINTEXT one (",SSL://127.0.0.1:PORT").
        self.extra_listeners = extra_listeners
        self.port, self.admin_port = free_port(), free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.data = self.workdir / "data"
        self.logf = open(self.workdir / "tessera.log", "wb")
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self):
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        cmd = [str(self.binary), "--data-dir", str(self.data),
               "--listeners", f"PLAINTEXT://{self.bootstrap}{self.extra_listeners}",
               "--admin-listener", f"127.0.0.1:{self.admin_port}"]
        for k, v in self.overrides.items():
            cmd += ["-o", f"{k}={v}"]
        self.proc = procguard.spawn(cmd, stdout=self.logf, stderr=self.logf, stdin=subprocess.DEVNULL,
                                    cwd=self.workdir, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tessera exited {self.proc.returncode}; log: {self.logf.name}")
            try:
                if self.request("GET", "/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"tessera not ready in 30 s; log: {self.logf.name}")

    def stop(self, keep: bool = False):
        terminate_then_kill(self.proc, 20)
        self.logf.close()
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def request(self, method: str, path: str) -> tuple[int, str]:
        """(status, body text) from the admin port; HTTP error answers are
        returned, not raised."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", method=method,
                                     data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def ranges(self, topic: str | None = None) -> list[dict]:
        status, body = self.request("GET", "/ranges")
        if status != 200:
            raise RuntimeError(f"GET /ranges -> {status} {body}")
        return [r for r in json.loads(body) if topic is None or r["topic"] == topic]

    def active_ranges(self, topic: str) -> list[dict]:
        return sorted((r for r in self.ranges(topic) if r["active"]), key=lambda r: r["lo"])
