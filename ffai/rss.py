"""Peak resident memory of a process tree, sampled from /proc (Linux).

``ru_maxrss`` covers one process (or the largest child), not a tree of workers alive at
the same time; the bench and the memory benchmark need the sum over the tree at its peak.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants right now."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
        stack += _children(p)
    return total


class PeakRSS:
    """Samples ``tree_rss(pid)`` every ``interval`` seconds in a thread; ``peak`` is the max."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_measured(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, int, float]:
    """Run ``cmd``; return its completed process, the tree's peak RSS in bytes, and seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    with PeakRSS(proc.pid) as peak:
        out, err = proc.communicate()
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    return done, peak.peak, time.perf_counter() - start
