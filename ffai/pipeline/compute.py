"""The one thread a process computes on.

torch's CPU build runs an op's parallel work on OpenMP, and GNU OpenMP (libgomp) gives every
thread that starts parallel work a pool of worker threads of its own, kept until that thread
ends. Once a process's pools hold more threads than it has CPUs, libgomp no longer lets idle
pool threads spin between parallel regions but puts them to sleep, so every op pays to wake
them again, which slows small ops most (docs/precision-and-speed.md, *One compute thread per
process*). Hence:

- a process whose stages take turns (``ProcessConfig.serial``) runs every stage function and
  every stage factory (loading weights is parallel work too) on one :class:`ComputeThread`, so
  it has one pool;
- a process whose stages run side by side builds them on a short-lived ComputeThread, whose
  pool goes when the thread ends, so the thread that loaded them holds none.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable


class ComputeThread:
    """A daemon thread that runs the calls handed to :meth:`run`, one at a time, in order."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], list, threading.Event] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on this thread; its result, or its exception raised here."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        done = threading.Event()
        outcome: list = []
        self._jobs.put((lambda: fn(*args, **kwargs), outcome, done))
        done.wait()
        ok, value = outcome
        if not ok:
            raise value
        return value

    def close(self, timeout: float | None = None) -> None:
        """End the thread once the calls handed to it so far are done (waits up to
        ``timeout``; a call still running is not interrupted, the thread is a daemon)."""
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, outcome, done = job
            try:
                outcome += [True, call()]
            except BaseException as e:  # handed back to the caller, who raises it
                outcome += [False, e]
            finally:
                del call
                done.set()
