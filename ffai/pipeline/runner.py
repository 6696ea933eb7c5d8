"""Placing stages: :class:`ProcessRunner` (named worker processes, spawn context) and
:class:`InlineRunner` (every stage as threads of this process). Both offer the same small
interface to the coordinator:

``start()``, ``send(stage, message)``, ``abort_everywhere(request_id)``,
``request_stats(token)``, ``recv(timeout) -> Message | None``, ``dead_workers()``,
``worker_pids()``, ``n_workers`` and ``stop()``.

Process placement: every worker has one inbox queue; stages send straight to the inbox
of the target stage's worker, and everything for the caller goes to one results queue.
Payloads are pickled with multiprocessing's ForkingPickler, so torch tensors cross through
shared memory (torch's default ``file_descriptor`` strategy unlinks the segment at once,
which leaves nothing in /dev/shm even after a SIGKILL). A worker reports ``ready`` or its
traceback within ``start_timeout``; a failed start stops every started worker.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import time
import traceback
from typing import Any

from ffai import messages
from ffai.errors import FfaiError
from ffai.kit.host import set_threads
from ffai.pipeline.config import PipelineConfig
from ffai.pipeline.errors import PipelineStartError
from ffai.pipeline.messages import FAILED, READY, SAY, Message
from ffai.pipeline.worker import (
    ABORT_ALL,
    STATS_REQUEST,
    STOP,
    Channel,
    WorkerHost,
    run_init,
    serve,
    worker_main,
)

_FAILED_REPORT_GRACE_S = 2.0  # a worker that died at start may still have its traceback in flight


class ProcessRunner:
    def __init__(self, config: PipelineConfig, start_timeout: float = 60.0, stop_timeout: float = 5.0) -> None:
        self.config = config
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._groups = config.process_groups()
        self._where = {stage: w for w, stages in self._groups.items() for stage in stages}
        self._procs: dict[str, Any] = {}
        self._inboxes: dict[str, Channel] = {}
        self._results: Channel | None = None

    @property
    def n_workers(self) -> int:
        return len(self._groups)

    def start(self) -> None:
        try:
            self._spawn()
            self._await_ready(time.monotonic() + self.start_timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self) -> None:
        # The queues stay out of start()'s frame: a traceback kept by the caller would
        # otherwise keep their semaphores in /dev/shm alive.
        ctx = multiprocessing.get_context("spawn")
        self._results = Channel(ctx.Queue())
        self._inboxes = {w: Channel(ctx.Queue()) for w in self._groups}
        raw_inboxes = {w: ch.queue for w, ch in self._inboxes.items()}
        # PR_SET_PDEATHSIG follows the thread that forks; only the main thread lives as
        # long as the process, so other threads rely on the workers' watchdog alone.
        use_pdeathsig = threading.current_thread() is threading.main_thread()
        for w in self._groups:
            args = (w, self.config, raw_inboxes, self._results.queue, os.getpid(), use_pdeathsig)
            proc = ctx.Process(target=worker_main, args=args, name=f"ffai-pipeline-{w}", daemon=True)
            proc.start()
            self._procs[w] = proc

    def _await_ready(self, deadline: float) -> None:
        waiting = set(self._groups)
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                names = ", ".join(repr(w) for w in sorted(waiting))
                plural = "s" if len(waiting) > 1 else ""
                raise PipelineStartError(f"worker{plural} {names} did not report ready within {self.start_timeout:g} s")
            msg = self._results.get(timeout=min(0.2, remaining))
            if msg is not None:
                self._on_start_message(msg, waiting)
                continue
            dead = [w for w in waiting if not self._procs[w].is_alive()]
            if dead:
                self._raise_dead_at_start(dead[0])

    def _on_start_message(self, msg: Message, waiting: set[str]) -> None:
        if msg.kind == READY:
            waiting.discard(msg.source)
        elif msg.kind == FAILED:
            raise start_failure(msg)
        elif msg.kind == SAY:  # said while loading (a compile's note, say)
            messages.say_again(*msg.data)

    def _raise_dead_at_start(self, w: str) -> None:
        msg = self._results.get(timeout=_FAILED_REPORT_GRACE_S)
        if msg is not None and msg.kind == FAILED:
            raise start_failure(msg)
        code = self._procs[w].exitcode
        raise PipelineStartError(f"worker {w!r} exited with code {code} before reporting ready")

    def send(self, stage: str, msg: Message) -> None:
        self._inboxes[self._where[stage]].put((stage, msg))

    def abort_everywhere(self, request_id: Any) -> None:
        self._to_all(ABORT_ALL, request_id)

    def request_stats(self, token: Any) -> None:
        self._to_all(STATS_REQUEST, token)

    def _to_all(self, word: str, value: Any) -> None:
        for w, inbox in self._inboxes.items():
            if self._procs.get(w) is not None and self._procs[w].is_alive():
                inbox.put((word, value))

    def recv(self, timeout: float) -> Message | None:
        return self._results.get(timeout=timeout)

    def dead_workers(self) -> list[tuple[str, int | None, int | None]]:
        """(name, pid, exit code) of each worker no longer running."""
        return [(w, p.pid, p.exitcode) for w, p in self._procs.items() if not p.is_alive()]

    def worker_pids(self) -> dict[str, int]:
        return {w: p.pid for w, p in self._procs.items()}

    def stop(self) -> None:
        """Ask every worker to stop, then terminate and kill stragglers; release the queues."""
        for w, proc in self._procs.items():
            if proc.is_alive() and w in self._inboxes:
                try:
                    self._inboxes[w].put((STOP, None))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + self.stop_timeout
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        for end in ("terminate", "kill"):
            for proc in self._procs.values():
                if proc.is_alive():
                    getattr(proc, end)()
                    proc.join(1.0)
        for channel in (*self._inboxes.values(), *([self._results] if self._results else [])):
            channel.close()
        # Drop the queues so their semaphores are unlinked from /dev/shm now, not at exit.
        self._inboxes, self._results = {}, None


def start_failure(msg: Message) -> Exception:
    """The error to raise for a worker's FAILED report: its own FfaiError if it raised one
    (with the worker's traceback as a note, shown by ``-v``), else its traceback text."""
    text, cause = msg.data
    if cause is not None:
        if hasattr(cause, "add_note"):
            cause.add_note(f"in worker {msg.source!r}:\n{text}")
        return cause
    return PipelineStartError(f"worker {msg.source!r} failed to start:\n{text}")


class InlineRunner:
    """Every stage as threads of this process, through plain ``queue.Queue`` s: payloads
    pass by reference. Process ``init`` functions run here, once each; if any process
    sets ``threads``, torch gets the largest such count (one process now hosts them all)."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._results: queue.Queue[Message] = queue.Queue()
        self._host: WorkerHost | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    n_workers = 1

    def start(self) -> None:
        threads = [p.threads for p in self.config.processes if p.threads is not None]
        host = WorkerHost(
            "inline",
            self.config,
            [s.name for s in self.config.stages],
            send=lambda target, msg: self._inbox.put((target, msg)),
            to_caller=self._results.put,
            serial=any(p.serial for p in self.config.processes),
        )
        try:
            if threads:
                set_threads(max(threads))
            for process in self.config.processes:
                run_init(process)
            host.build()
            host.start()
        except FfaiError:
            host.stop()
            raise
        except Exception as e:
            host.stop()
            raise PipelineStartError(f"inline pipeline failed to start:\n{traceback.format_exc()}") from e
        self._host = host
        self._thread = threading.Thread(target=self._serve, name="ffai-pipeline-inline", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        serve(self._host, self._inbox.get)

    def send(self, stage: str, msg: Message) -> None:
        self._inbox.put((stage, msg))

    def abort_everywhere(self, request_id: Any) -> None:
        self._inbox.put((ABORT_ALL, request_id))

    def request_stats(self, token: Any) -> None:
        self._inbox.put((STATS_REQUEST, token))

    def recv(self, timeout: float) -> Message | None:
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            return None

    def dead_workers(self) -> list[tuple[str, int | None, int | None]]:
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            return [("inline", os.getpid(), None)]
        return []

    def worker_pids(self) -> dict[str, int]:
        return {}

    def stop(self) -> None:
        self._stopping = True
        if self._thread is not None:
            self._inbox.put((STOP, None))
            self._thread.join(5.0)
        if self._host is not None:
            self._host.stop()
