"""Hosting stages: one :class:`WorkerHost` per worker process, or one for the whole
pipeline inline.

A host builds its stages from their factories, then runs a receive loop over envelopes
``(target, message)``: ``target`` is a stage name or one of the control words
``@stop``, ``@abort`` (``message`` is a request id, applied to every stage here) and
``@stats`` (``message`` is a token; the host answers with each stage's pending counts).

:func:`worker_main` is the body of a spawned worker process: it follows its parent (exits
when the parent dies, even by SIGKILL), applies the process settings, builds its stages,
reports ``ready`` or its traceback, and serves until ``@stop``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from ffai import messages
from ffai.errors import FfaiError
from ffai.kit.host import release_free_heap, set_threads
from ffai.pipeline.compute import ComputeThread
from ffai.pipeline.config import PipelineConfig, ProcessConfig, StageConfig, resolve
from ffai.pipeline.errors import ConfigError
from ffai.pipeline.messages import ABORT, CALLER, FAILED, READY, SAY, STATS, Message
from ffai.pipeline.scheduler import ContinuousScheduler, Scheduler, SimpleScheduler, is_continuous, with_emitter
from ffai.pipeline.stage import Stage

log = logging.getLogger(__name__)

STOP = "@stop"
ABORT_ALL = "@abort"
STATS_REQUEST = "@stats"

_PR_SET_PDEATHSIG = 1
_PARENT_POLL_S = 0.5


class Channel:
    """A multiprocessing queue that pickles on ``put``, in the caller's thread.

    Pickling eagerly (with the ForkingPickler, so torch tensors travel through shared
    memory) makes an unpicklable payload fail the request that carried it, instead of
    vanishing in the queue's feeder thread, and snapshots the payload at send time.
    """

    def __init__(self, q: Any) -> None:
        self.queue = q

    def put(self, obj: Any) -> None:
        self.queue.put(bytes(ForkingPickler.dumps(obj)))

    def get(self, timeout: float | None = None) -> Any:
        """The next object, or None after ``timeout`` seconds without one."""
        try:
            data = self.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        return ForkingPickler.loads(data)

    def close(self) -> None:
        # Never wait at exit for data nobody will read (a dead worker's inbox).
        self.queue.cancel_join_thread()
        self.queue.close()


def make_scheduler(config: StageConfig, compute: ComputeThread | None = None) -> Scheduler:
    """Run the stage's factory; wrap a plain function in a SimpleScheduler, trimming the heap
    after each call (:func:`_trimming_heap`). With ``compute``, the function runs on that thread,
    where the process's stages take turns (``ffai.pipeline.compute``)."""
    made = resolve(config.factory)(*config.args, **config.kwargs)
    batching = config.max_batch_size > 1 or config.max_batch_wait_ms > 0 or config.batch_wait_when_idle
    if isinstance(made, Scheduler):
        if batching:
            raise ConfigError(f"stage {config.name!r}: batching options apply only when the factory returns a function")
        if compute is not None:
            raise ConfigError(
                f"stage {config.name!r}: a serial process needs stages that are functions, not Schedulers"
            )
        return made
    if is_continuous(made):
        if batching:
            raise ConfigError(f"stage {config.name!r}: batching options apply only when the factory returns a function")
        return ContinuousScheduler(made, run=compute.run if compute is not None else None, after=release_free_heap)
    if not callable(made):
        kind = type(made).__name__
        raise ConfigError(f"stage {config.name!r}: factory returned {kind}, not a Scheduler or a function")
    made = _trimming_heap(made)
    if compute is not None:
        made = _taking_turns(made, compute)
    if config.max_batch_size == 1:
        return SimpleScheduler(made)
    return SimpleScheduler(
        batch_fn=made,
        max_batch_size=config.max_batch_size,
        max_batch_wait_ms=config.max_batch_wait_ms,
        batch_wait_when_idle=config.batch_wait_when_idle,
    )


def _trimming_heap(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, handing the heap's free pages back to the OS each time it returns
    (``ffai.kit.host.release_free_heap``), so that the next stage's peak does not sit on top of what
    this one freed. Here, where every runner (inline, worker process, Ray actor) builds a stage,
    so stage functions stay pure computation."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            release_free_heap()

    return run


def _taking_turns(fn: Callable[[Any], Any], compute: ComputeThread) -> Callable[[Any], Any]:
    def run(payload: Any) -> Any:
        return compute.run(with_emitter(fn, payload))

    return run


def run_init(process: ProcessConfig) -> None:
    if process.init is not None:
        resolve(process.init)(*process.init_args, **process.init_kwargs)


class WorkerHost:
    def __init__(
        self,
        name: str,
        config: PipelineConfig,
        stage_names: list[str],
        send: Callable[[str, Message], None],
        to_caller: Callable[[Message], None],
        serial: bool = False,
    ) -> None:
        self.name = name
        self.config = config
        self.stage_names = stage_names
        # Stages that take turns take them on one thread (ffai.pipeline.compute).
        self._compute = ComputeThread(f"{name}-compute") if serial else None
        self.stages: dict[str, Stage] = {}
        self._send_to_stage = send
        self._to_caller = to_caller

    def build(self) -> None:
        """Make the stages, their factories run off the calling thread (``ffai.pipeline.compute``):
        on the compute thread of stages that take turns, else on one that ends afterwards."""
        loader = self._compute or ComputeThread(f"{self.name}-load")
        try:
            for name in self.stage_names:
                stage_config = self.config.stage(name)
                scheduler = loader.run(make_scheduler, stage_config, self._compute)
                self.stages[name] = Stage(stage_config, scheduler, self._send)
        finally:
            if loader is not self._compute:
                loader.close()

    def start(self) -> None:
        for stage in self.stages.values():
            stage.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop every stage; wait up to ``timeout`` for their threads (a function still
        running is not interrupted; its thread is a daemon)."""
        for stage in self.stages.values():
            stage.stop()
        deadline = time.monotonic() + timeout
        for stage in self.stages.values():
            stage.join(max(0.0, deadline - time.monotonic()))
        if self._compute is not None:
            self._compute.close(max(0.0, deadline - time.monotonic()))

    def handle(self, envelope: tuple[str, Any]) -> bool:
        """Act on one envelope; False means stop serving."""
        target, msg = envelope
        if target == STOP:
            return False
        if target == ABORT_ALL:
            for stage in self.stages.values():
                stage.feed(Message(ABORT, msg))
        elif target == STATS_REQUEST:
            stats = {name: stage.stats() for name, stage in self.stages.items()}
            self._to_caller(Message(STATS, msg, stats, self.name))
        else:
            self.stages[target].feed(msg)
        return True

    def _send(self, target: str, msg: Message) -> None:
        if target == CALLER:
            self._to_caller(msg)
        else:
            self._send_to_stage(target, msg)


class _SayToCaller(logging.Handler):
    """What the worker's stages say through ``ffai.messages`` (notes too), sent to the
    coordinator, whose process says it again: else a note is lost and a warning reaches stderr
    bare, through logging's last resort."""

    def __init__(self, out: Channel, name: str) -> None:
        super().__init__(messages.NOTE)
        self.out, self.name = out, name

    def emit(self, record: logging.LogRecord) -> None:
        self.out.put(Message(SAY, None, (record.levelno, record.getMessage()), self.name))


def worker_main(
    name: str,
    config: PipelineConfig,
    inboxes: dict[str, Any],
    results: Any,
    parent_pid: int,
    use_pdeathsig: bool,
) -> None:
    """Body of a spawned worker process. Never returns normally: exits with os._exit."""
    _follow_parent(parent_pid, use_pdeathsig)
    # Ctrl-C reaches the whole process group; the parent decides how the workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channels = {w: Channel(q) for w, q in inboxes.items()}
    out = Channel(results)
    where = {stage: w for w, stages in config.process_groups().items() for stage in stages}
    host = WorkerHost(
        name,
        config,
        config.process_groups()[name],
        send=lambda target, msg: channels[where[target]].put((target, msg)),
        to_caller=out.put,
        serial=config.process_config(name).serial,
    )
    messages.listen(_SayToCaller(out, name))
    try:
        process = config.process_config(name)
        if process.threads is not None:
            set_threads(process.threads)
        run_init(process)
        host.build()
        host.start()
    except BaseException as e:
        # An FfaiError (a bad checkpoint, say) travels as itself, so the user reads its own
        # one-line message; anything else is reported by its traceback text.
        cause = e if isinstance(e, FfaiError) else None
        out.put(Message(FAILED, None, (traceback.format_exc(), cause), name))
        results.close()
        results.join_thread()  # the traceback must reach the parent before we exit
        os._exit(1)
    out.put(Message(READY, None, os.getpid(), name))
    serve(host, channels[name].get)
    host.stop(timeout=0)  # the process exits next; a busy stage need not finish
    for channel in (*channels.values(), out):
        channel.queue.cancel_join_thread()
    os._exit(0)


def serve(host: WorkerHost, get: Callable[[], tuple[str, Any]]) -> None:
    """The receive loop: hand each envelope to the host until ``@stop``."""
    while True:
        try:
            if not host.handle(get()):
                return
        except Exception:  # one bad envelope must not take the whole worker down
            log.exception("pipeline worker %r: an incoming message could not be handled", host.name)


def _follow_parent(parent_pid: int, use_pdeathsig: bool) -> None:
    """Exit when the parent dies. PR_SET_PDEATHSIG fires when the parent *thread* ends, so
    the parent asks for it only when it starts workers from its main thread; a watchdog
    polling the parent pid covers every other case (and non-Linux systems)."""
    if use_pdeathsig and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watchdog", daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)
