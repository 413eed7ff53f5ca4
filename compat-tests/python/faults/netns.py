"""Network namespaces for the fault harness: one per node, one for the
clients, all joined by a bridge in a namespace of its own.

    tfh-br  : bridge tfh0 (no address), one veth end per namespace below
    tfh-nN  : node N, eth0 = 10.77.0.N/24
    tfh-c   : the clients (the harness itself runs here), 10.77.0.100/24

Everything lives in namespaces this module creates, so no address of the
root namespace is used or touched. A partition is a set of blackhole routes
(``ip -n tfh-nA route add blackhole 10.77.0.B/32``) in the node namespaces:
packets from A to B are dropped, so TCP between them stalls as on a real cut
link (no RST). The clients are never partitioned: a node cut off from its
peers still hears producers, the zombie-primary case.

``cleanup()`` removes every ``tfh-*`` namespace and SIGKILLs the processes
inside them (left from a previous run that died), so a start after a crash
of the harness begins clean.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess

PREFIX = "tfh-"
BRIDGE_NS = f"{PREFIX}br"
CLIENT_NS = f"{PREFIX}c"
BRIDGE = "tfh0"
SUBNET = "10.77.0"
CLIENT_ADDR = f"{SUBNET}.100"
CLONE_NEWNET = 0x40000000


def node_ns(node: int) -> str:
    return f"{PREFIX}n{node}"


def node_addr(node: int) -> str:
    return f"{SUBNET}.{node}"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def cleanup() -> None:
    """Kill what runs in our namespaces and delete them (idempotent)."""
    for ns in namespaces():
        pids = ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            if int(pid) == os.getpid():  # the harness itself, in tfh-c
                continue
            try:
                os.kill(int(pid), signal.SIGCONT)  # a paused process dies too
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        ip("netns", "del", ns, check=False)


def _attach(ns: str, addr: str, ifname: str) -> None:
    """A veth pair: `eth0` with `addr` in `ns`, its peer `ifname` on the bridge."""
    ip("netns", "add", ns)
    ip("-n", ns, "link", "set", "lo", "up")
    ip("-n", BRIDGE_NS, "link", "add", ifname, "type", "veth", "peer", "name", "eth0",
       "netns", ns)
    ip("-n", BRIDGE_NS, "link", "set", ifname, "master", BRIDGE, "up")
    ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")


def add_node(node: int) -> None:
    """One more node namespace on the bridge (a broker that joins later)."""
    _attach(node_ns(node), node_addr(node), f"n{node}")


def setup(nodes: int) -> None:
    cleanup()
    ip("netns", "add", BRIDGE_NS)
    ip("-n", BRIDGE_NS, "link", "set", "lo", "up")
    ip("-n", BRIDGE_NS, "link", "add", BRIDGE, "type", "bridge")
    ip("-n", BRIDGE_NS, "link", "set", BRIDGE, "up")
    for n in range(1, nodes + 1):
        add_node(n)
    _attach(CLIENT_NS, CLIENT_ADDR, "c")


def enter_client_ns() -> None:
    """Move the calling thread (call it from the main thread before any other
    thread starts: new threads and children inherit it) into the client
    namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{CLIENT_NS}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {CLIENT_NS}: {os.strerror(err)}")
    finally:
        os.close(fd)


# ---- partitions ---------------------------------------------------------

def cut(a: int, b: int) -> None:
    """Drop every packet between nodes a and b (both directions)."""
    ip("-n", node_ns(a), "route", "replace", "blackhole", f"{node_addr(b)}/32")
    ip("-n", node_ns(b), "route", "replace", "blackhole", f"{node_addr(a)}/32")


def heal_all(nodes: int) -> None:
    for n in range(1, nodes + 1):
        out = ip("-n", node_ns(n), "route", "show", "type", "blackhole", check=False).stdout
        for line in out.splitlines():
            dest = line.split()[1] if line.startswith("blackhole") else line.split()[0]
            ip("-n", node_ns(n), "route", "del", "blackhole", dest, check=False)


def apply_partition(links: list[tuple[int, int]]) -> None:
    for a, b in links:
        cut(a, b)
