"""Checks shared by the pipeline tests: shared memory left behind, processes left running."""

from __future__ import annotations

import time
from pathlib import Path

SHM = Path("/dev/shm")
# torch's shared tensors and multiprocessing's named semaphores (queue locks).
SHM_PREFIXES = ("torch_", "sem.mp-")


def shm_entries() -> set[str]:
    if not SHM.is_dir():
        return set()
    return {p.name for p in SHM.iterdir() if p.name.startswith(SHM_PREFIXES)}


def pid_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
