"""Lost unsynced writes ("lazyfs-lite"): after a kill -9, put a node's data
directory in the state a power loss could have left, from what the
``shims/lazysync.c`` LD_PRELOAD library logged (see its header for the log's
lines).

Model, replayed in log order:

* a file keeps the length its last successful fsync/fdatasync saw; bytes
  written after it are cut (a file created and never synced becomes empty);
* a name created (O_CREAT) or renamed into a directory is durable only once
  that directory was fsynced after it: otherwise a created file is removed
  and a rename undone (the file goes back to its old name, and the file it
  replaced, kept alive by a hard link, comes back).

Not modelled (see lazysync.c): unlinks, O_SYNC opens, torn writes inside
the synced prefix, reordering within it. ``plan`` is the pure part (log and
a listing in, actions out); ``recover`` applies them and starts a new log
that holds the recovered state as durable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Plan:
    # In order: ("unlink", path) for a creation, ("rename", src, dst) for an
    # undone rename and a replaced file put back.
    names: list[tuple] = field(default_factory=list)
    truncate: dict[str, int] = field(default_factory=dict)  # path -> durable length
    bytes_dropped: int = 0


def _parent(path: str) -> str:
    return os.path.dirname(path) or "/"


def plan(log_lines: list[str], listing: dict[str, tuple[int, int]]) -> Plan:
    """`listing`: every regular file now on disk (the kept links too),
    path -> (inode, size).
    Names first (undo what no directory fsync made durable, last op first),
    then lengths (each file cut to its inode's durable length)."""
    durable: dict[int, int] = {}
    pending: list[tuple] = []  # ("C", ino, path) | ("R", ino, old, new, keep|None)
    for line in log_lines:
        parts = line.rstrip("\n").split(" ")
        if len(parts) < 2:
            continue  # a torn last line (the process died mid-write)
        kind = parts[0]
        try:
            if kind == "S" and len(parts) >= 4:
                durable[int(parts[1])] = int(parts[2])
            elif kind == "C" and len(parts) >= 3:
                durable[int(parts[1])] = 0
                pending.append(("C", int(parts[1]), " ".join(parts[2:])))
            elif kind == "R" and len(parts) == 4:
                pending.append(("R", int(parts[1]), parts[2], parts[3], None))
            elif kind == "K" and len(parts) == 4 and pending and pending[-1][0] == "R":
                op = pending[-1]
                pending[-1] = (op[0], op[1], op[2], op[3], (int(parts[1]), parts[2]))
            elif kind == "D":
                d = " ".join(parts[1:])
                pending = [op for op in pending if _parent(op[2] if op[0] == "C" else op[3]) != d]
        except ValueError:
            continue
    p = Plan()
    names = {path: ino for path, (ino, _) in listing.items()}
    sizes = {ino: size for ino, size in listing.values()}
    for op in reversed(pending):
        if op[0] == "C":
            _, ino, path = op
            if names.get(path) == ino:
                p.names.append(("unlink", path))
                del names[path]
        else:
            _, ino, old, new, keep = op
            if names.get(new) == ino and old not in names:
                p.names.append(("rename", new, old))
                del names[new]
                names[old] = ino
                if keep is not None and names.get(keep[1]) == keep[0]:
                    p.names.append(("rename", keep[1], new))
                    del names[keep[1]]
                    names[new] = keep[0]
    for path, ino in names.items():
        if ino in durable and ino in sizes and sizes[ino] > durable[ino]:
            p.truncate[path] = durable[ino]
            p.bytes_dropped += sizes[ino] - durable[ino]
    return p


def listing(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            out[path] = (st.st_ino, st.st_size)
    return out


def recover(data_dir: Path, log_path: Path, keep_dir: Path) -> Plan:
    """Apply the plan to `data_dir` (the node must be dead) and restart the
    log from the recovered state."""
    lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    root = Path(os.path.realpath(data_dir))
    p = plan(lines, {**listing(root), **listing(keep_dir)})
    for action in p.names:
        try:
            if action[0] == "unlink":
                os.unlink(action[1])
            else:
                os.replace(action[1], action[2])
        except FileNotFoundError:
            pass
    for path, size in p.truncate.items():
        try:
            os.truncate(path, size)
        except FileNotFoundError:
            pass
    for k in keep_dir.glob("*"):
        k.unlink(missing_ok=True)
    os.sync()
    with open(log_path, "w") as log:
        for path, (ino, size) in listing(root).items():
            log.write(f"S {ino} {size} {path}\n")
    return p
