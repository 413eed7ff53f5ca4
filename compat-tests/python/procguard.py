"""Every child process the compat tests (and the benchmarks) start is stopped.

``spawn()`` is ``subprocess.Popen`` plus a module-level registry of the
processes it started. ``kill_all()`` SIGKILLs every registered process that is
still running. It runs:

* from fixture teardown (conftest: ``broker_factory`` and an autouse fixture
  that reaps whatever a test started and left running),
* from ``pytest_sessionfinish`` (conftest), which also runs on Ctrl-C,
* at interpreter exit (``atexit``),
* on SIGTERM: ``install_sigterm_handler()`` turns SIGTERM into
  ``KeyboardInterrupt`` in the main thread, so pytest (or a benchmark's
  ``finally`` blocks) unwinds as on Ctrl-C: fixtures are torn down, pytest
  prints its summary, and ``atexit`` covers the rest.

Last resort for a parent killed with SIGKILL (nothing runs then): a child
spawned from the main thread is started under ``setpriv --pdeathsig KILL``
(util-linux) when that exists, so the kernel kills it when its parent dies.
(The death signal fires when the *thread* that forked exits, hence main
thread only.)

Children stay in pytest's process group (no ``start_new_session``), so a
signal sent to the whole group (terminal Ctrl-C, ``timeout``, a CI job
cancel) reaches them as well.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import subprocess
import threading

_live: dict[int, subprocess.Popen] = {}  # spawn number -> process
_spawned = 0
_lock = threading.Lock()
_SETPRIV = shutil.which("setpriv")


def _pdeathsig_prefix(cmd) -> list[str]:
    if _SETPRIV is None or threading.current_thread() is not threading.main_thread():
        return []
    if isinstance(cmd, (str, bytes)) or not cmd or shutil.which(str(cmd[0])) is None:
        # Let Popen raise its own FileNotFoundError for a missing program.
        return []
    return [_SETPRIV, "--pdeathsig", "KILL", "--"]


def spawn(cmd, **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen_kwargs)``, registered for ``kill_all``."""
    global _spawned
    prefix = _pdeathsig_prefix(cmd)
    args = prefix + [str(c) for c in cmd] if prefix else cmd
    proc = subprocess.Popen(args, **popen_kwargs)
    with _lock:
        for n in [n for n, p in _live.items() if p.poll() is not None]:
            del _live[n]
        _spawned += 1
        _live[_spawned] = proc
    return proc


def mark() -> int:
    """A point in time for ``kill_all(since=...)``."""
    with _lock:
        return _spawned


def kill(proc: subprocess.Popen | None, wait: float = 10.0) -> int | None:
    """SIGKILL ``proc`` if it still runs and reap it; never raises."""
    if proc is None:
        return None
    try:
        if proc.poll() is None:
            proc.kill()
        return proc.wait(wait)
    except Exception:  # noqa: BLE001 - cleanup must go on
        return None
    finally:
        if proc.poll() is not None:  # still running: kill_all tries again
            with _lock:
                for n in [n for n, p in _live.items() if p is proc]:
                    del _live[n]


def kill_all(since: int = 0) -> int:
    """Kill every registered process spawned after ``mark()`` returned
    ``since`` (default: all of them); returns how many were still running."""
    with _lock:
        targets = [p for n, p in _live.items() if n > since]
    running = 0
    for p in targets:
        if p.poll() is None:
            running += 1
        kill(p)
    return running


atexit.register(kill_all)


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_sigterm_handler() -> None:
    """SIGTERM -> KeyboardInterrupt (main thread only; keeps a handler someone
    else installed)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _sigterm)
