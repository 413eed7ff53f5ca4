"""Tessera nodes of the fault harness, each in its own network namespace
(netns.py): node N listens on 10.77.0.N (Kafka 9092, admin 9644,
controller/metadata 19092), nothing outside its namespace.

Nodes 1..V are controller+broker voters of the metadata quorum, as in
`tessera cluster` (controller.quorum.voters names them); the others are
broker-only nodes (``process.roles=broker`` with a ``metadata.listener``).
Every node runs under LD_PRELOAD of the two shims: failsync (fsync fails or
hangs while a trigger file exists) and lazysync (logs what was made durable,
for lazyfs.recover after a simulated power loss).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import procguard

from . import lazyfs, netns

KAFKA_PORT, ADMIN_PORT, CONTROLLER_PORT = 9092, 9644, 19092
SHIMS = Path(__file__).resolve().parents[1] / "shims"

# Timing close to test_cluster.py's cluster fixture: failures are noticed in
# seconds, not Kafka's production defaults.
NODE_DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "range.policy.enable": "false",
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
    "replica.lag.time.max.ms": "2000",
    "log.segment.bytes": str(1 << 20),  # rolls during faults
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "replica.heal.delay.ms": "10000",
}


def build_shims(out_dir: Path) -> list[Path]:
    """Compile failsync and lazysync (in that order: failsync's wrappers run
    first, so a failed fsync is never logged as durable)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    libs = []
    for name in ("failsync", "lazysync"):
        lib = out_dir / f"lib{name}.so"
        src = SHIMS / f"{name}.c"
        if not lib.exists() or lib.stat().st_mtime < src.stat().st_mtime:
            subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(src),
                            "-ldl", "-lpthread"], check=True)
        libs.append(lib)
    return libs


def controller_voters_for(nodes: int) -> int:
    """Voters of an N-node harness cluster: 3 (5 nodes are 3 voters and 2
    broker-only nodes, so both kinds take faults)."""
    return 1 if nodes <= 2 else 3


class Node:
    def __init__(self, node_id: int, workdir: Path, binary: Path, voters: str, voter: bool,
                 shims: list[Path], overrides: dict[str, str]):
        self.id = node_id
        self.voter = voter
        self.ns = netns.node_ns(node_id)
        self.addr = netns.node_addr(node_id)
        self.dir = workdir / f"node-{node_id}"
        self.data = self.dir / "data"
        self.keep = self.dir / "keep"
        self.durable_log = self.dir / "durable.log"
        self.fail_trigger = self.dir / "fsync-fail"
        self.hang_trigger = self.dir / "fsync-hang"
        self.lie_trigger = self.dir / "fsync-lie"
        self.log_path = self.dir / "node.log"
        self.binary, self.voters, self.shims = binary, voters, shims
        self.overrides = overrides
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0
        for d in (self.data, self.keep):
            d.mkdir(parents=True, exist_ok=True)

    @property
    def bootstrap(self) -> str:
        return f"{self.addr}:{KAFKA_PORT}"

    def admin_url(self, path: str) -> str:
        return f"http://{self.addr}:{ADMIN_PORT}{path}"

    def command(self) -> list[str]:
        cmd = [
            "ip", "netns", "exec", self.ns,
            str(self.binary), "--data-dir", str(self.data), "--node-id", str(self.id),
            "--listeners", f"PLAINTEXT://{self.addr}:{KAFKA_PORT}",
            "--admin-listener", f"{self.addr}:{ADMIN_PORT}",
            "-o", f"controller.quorum.voters={self.voters}",
        ]
        if not self.voter:
            cmd += ["-o", "process.roles=broker",
                    "-o", f"metadata.listener={self.addr}:{CONTROLLER_PORT}"]
        for k, v in self.overrides.items():
            cmd += ["-o", f"{k}={v}"]
        return cmd

    def start(self) -> None:
        assert not self.running(), f"node {self.id} already running"
        env = dict(os.environ)
        env.update({
            "RUST_LOG": os.environ.get("FAULTS_RUST_LOG", "info,openraft=warn"),
            "LD_PRELOAD": " ".join(str(s) for s in self.shims),
            "FAILSYNC_TRIGGER": str(self.fail_trigger),
            "FAILSYNC_HANG_TRIGGER": str(self.hang_trigger),
            "FAILSYNC_LIE_TRIGGER": str(self.lie_trigger),
            "FAILSYNC_PATH_MATCH": "/topics/",
            "LAZYSYNC_LOG": str(self.durable_log),
            "LAZYSYNC_KEEP": str(self.keep),
        })
        self.starts += 1
        self.paused = False
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== harness: start #{self.starts} at {time.strftime('%H:%M:%S')} "
                      f"=====\n".encode())
            log.flush()
            self.proc = procguard.spawn(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=log, cwd=self.dir, env=env)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.admin_url("/ready"), timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                return False
            if self.ready():
                return True
            time.sleep(0.2)
        return False

    def signal(self, sig: int) -> None:
        if self.running():
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """kill -9 (a paused process dies as well)."""
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def lose_unsynced(self) -> lazyfs.Plan:
        """After kill(): the data dir as a power loss could leave it."""
        assert not self.running()
        return lazyfs.recover(self.data, self.durable_log, self.keep)

    def clear_triggers(self) -> None:
        for t in (self.fail_trigger, self.hang_trigger):
            t.unlink(missing_ok=True)

    def log_mark(self, text: str) -> None:
        """A line in the node's log, so its lines can be read against the
        nemesis schedule."""
        with open(self.log_path, "ab") as log:
            log.write(f"===== harness {time.strftime('%H:%M:%S')}: {text} =====\n".encode())


class Cluster:
    def __init__(self, workdir: Path, binary: Path, nodes: int, overrides: dict[str, str]):
        self.workdir, self.binary = workdir, binary
        self.voter_count = controller_voters_for(nodes)
        self.voters = ",".join(f"{i}@{netns.node_addr(i)}:{CONTROLLER_PORT}"
                               for i in range(1, self.voter_count + 1))
        self.overrides = {**NODE_DEFAULTS, **overrides}
        self.shims = build_shims(workdir / "shims")
        self.nodes: dict[int, Node] = {}
        self.retired: list[Node] = []  # nodes that left (their logs are kept)
        for i in range(1, nodes + 1):
            self.add_node(i)

    def add_node(self, node_id: int) -> Node:
        """A node (not started); a namespace is made for an id beyond setup's."""
        if netns.node_ns(node_id) not in netns.namespaces():
            netns.add_node(node_id)
        n = Node(node_id, self.workdir, self.binary, self.voters, node_id <= self.voter_count,
                 self.shims, self.overrides)
        self.nodes[node_id] = n
        return n

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values() if n.id <= self.voter_count)

    def live(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.running() and not n.paused]

    def start_all(self, timeout: float = 120.0) -> None:
        for n in self.nodes.values():
            if not n.running():
                n.start()
        deadline = time.monotonic() + timeout
        for n in self.nodes.values():
            if not n.wait_ready(max(1.0, deadline - time.monotonic())):
                raise RuntimeError(f"node {n.id} not ready after {timeout:.0f}s; see {n.log_path}")

    def stop_all(self) -> None:
        for n in self.nodes.values():
            n.kill()

    def copy_logs(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for n in [*self.nodes.values(), *self.retired]:
            if n.log_path.exists():
                shutil.copy(n.log_path, dest / f"node-{n.id}.log")
