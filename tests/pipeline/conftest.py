"""Fixtures for the pipeline tests (helpers live in checks.py)."""

from __future__ import annotations

import os

import pytest

from .checks import pid_gone, shm_entries, wait_until


@pytest.fixture
def shm_clean():
    """Fail the test if it leaves torch or multiprocessing entries in /dev/shm."""
    before = shm_entries()
    yield
    assert wait_until(lambda: not (shm_entries() - before), timeout=5), f"leaked in /dev/shm: {shm_entries() - before}"


@pytest.fixture
def no_orphans():
    """Collect the worker pids a test registers; fail if any still runs afterwards."""
    pids: list[int] = []
    yield pids
    alive = [p for p in pids if not wait_until(lambda p=p: pid_gone(p), timeout=5)]
    for pid in alive:  # leave nothing behind for the next test, then fail
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert not alive, f"worker processes still running: {alive}"
