"""Schedulers own a stage's compute; their whole interface is two queues and three methods.

Contract (what :class:`ffai.pipeline.stage.Stage` relies on, and nothing more):

- ``inbox`` / ``outbox``: ``queue.Queue`` of :class:`~ffai.pipeline.messages.Message`.
  In: ``new_request``, ``stream_chunk``, ``stream_done``, ``abort``. Out: ``result``,
  ``stream``, ``error``.
- ``start()``: the blocking loop; the stage runs it in a thread of its own.
- ``stop()``: make ``start()`` return soon (a running function is not interrupted).
- ``abort(request_id)``: forget the request and emit nothing more for it; callable from any
  thread.

:class:`SimpleScheduler` runs a function per request or a batch function per batch.
:class:`ContinuousScheduler` serves requests together, a step at a time (a text decoder's batch).
:class:`StreamingScheduler` is the base for stages that consume stream chunks.
A function run by ``SimpleScheduler`` may call :func:`emit` to stream chunks of the request
it is working on (for example from a per-token callback); once that request is aborted,
``emit`` raises :class:`~ffai.pipeline.errors.RequestAborted` so the work stops early.
"""

from __future__ import annotations

import abc
import collections
import queue
import threading
import time
import traceback
from typing import Any, Callable, Sequence

from ffai.engines.contract import NoRoomYet
from ffai.pipeline.errors import PipelineError, RequestAborted
from ffai.pipeline.messages import (
    ABORT,
    ERROR,
    NEW_REQUEST,
    RESULT,
    STREAM,
    STREAM_CHUNK,
    STREAM_DONE,
    ErrorInfo,
    Message,
)

_POLL_S = 0.2  # how often an idle loop checks for stop()
_emitter = threading.local()


def emit(chunk: Any) -> None:
    """Stream ``chunk`` for the request the calling stage function is running now."""
    send = getattr(_emitter, "send", None)
    if send is None:
        raise PipelineError("emit() is only available inside a single-request stage function")
    send(chunk)


def with_emitter(fn: Callable[[Any], Any], payload: Any) -> Callable[[], Any]:
    """``fn(payload)`` as a call that may run on another thread and still :func:`emit` for the
    request the calling stage function is running now."""
    send = getattr(_emitter, "send", None)

    def call() -> Any:
        _emitter.send = send
        try:
            return fn(payload)
        finally:
            _emitter.send = None

    return call


class BoundedSet:
    """A thread-safe set that forgets its oldest members past ``maxlen`` (aborted ids)."""

    def __init__(self, maxlen: int = 65536) -> None:
        self._items: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self._maxlen = maxlen
        self._lock = threading.Lock()

    def add(self, item: Any) -> None:
        with self._lock:
            self._items[item] = None
            self._items.move_to_end(item)
            while len(self._items) > self._maxlen:
                self._items.popitem(last=False)

    def __contains__(self, item: Any) -> bool:
        with self._lock:
            return item in self._items


class Scheduler(abc.ABC):
    """Base: the queues, the stop flag, the aborted set and the loop skeleton."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.outbox: queue.Queue[Message] = queue.Queue()
        self._stopping = threading.Event()
        self._aborted = BoundedSet()

    def start(self) -> None:
        while not self._stopping.is_set():
            msg = self._get(_POLL_S)
            if msg is not None:
                self.handle(msg)

    def stop(self) -> None:
        self._stopping.set()

    def abort(self, request_id: Any) -> None:
        self._aborted.add(request_id)
        # The loop sees this too, so it can drop queued work and per-request state.
        self.inbox.put(Message(ABORT, request_id))

    @abc.abstractmethod
    def handle(self, msg: Message) -> None:
        """Act on one inbox message (new request, stream chunk/done, abort)."""

    def is_aborted(self, request_id: Any) -> bool:
        return request_id in self._aborted

    def put_result(self, request_id: Any, result: Any) -> None:
        self._put(Message(RESULT, request_id, result))

    def put_error(self, request_id: Any, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(exc))
        self._put(Message(ERROR, request_id, ErrorInfo.from_exception(exc, tb)))

    def put_chunk(self, request_id: Any, chunk: Any) -> None:
        if self.is_aborted(request_id):
            raise RequestAborted(f"request {request_id!r} was aborted")
        self.outbox.put(Message(STREAM, request_id, chunk))

    def _put(self, msg: Message) -> None:
        if not self.is_aborted(msg.request_id):
            self.outbox.put(msg)

    def _get(self, timeout: float | None) -> Message | None:
        try:
            return self.inbox.get(timeout=timeout) if timeout is None or timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return None


class SimpleScheduler(Scheduler):
    """One function per request, or one batch function per batch.

    ``fn(payload) -> result``; ``batch_fn(payloads) -> results`` (same length; an item that
    is an ``Exception`` fails only its own request). With ``batch_fn`` every batch, even a
    batch of one, goes through it; without it each item goes through ``fn``.

    Batching: a lone request on an idle stage runs at once; when a second request is
    already waiting, a window of ``max_batch_wait_ms`` opens to gather up to
    ``max_batch_size``. ``batch_wait_when_idle=True`` opens the window for a lone request
    too (trading its latency for fuller batches).
    """

    def __init__(
        self,
        fn: Callable[[Any], Any] | None = None,
        batch_fn: Callable[[list[Any]], Sequence[Any]] | None = None,
        max_batch_size: int = 1,
        max_batch_wait_ms: float = 0,
        batch_wait_when_idle: bool = False,
    ) -> None:
        super().__init__()
        if fn is None and batch_fn is None:
            raise PipelineError("SimpleScheduler needs fn or batch_fn")
        if max_batch_size < 1 or max_batch_wait_ms < 0:
            raise PipelineError("max_batch_size must be >= 1 and max_batch_wait_ms >= 0")
        self.fn = fn
        self.batch_fn = batch_fn
        self.max_batch_size = max_batch_size
        self.max_batch_wait_s = max_batch_wait_ms / 1000
        self.batch_wait_when_idle = batch_wait_when_idle
        self._pending: collections.deque[tuple[Any, Any]] = collections.deque()

    def start(self) -> None:
        while not self._stopping.is_set():
            batch = self._next_batch()
            if batch:
                self._run(batch)

    def handle(self, msg: Message) -> None:
        _queue(self, msg)

    def _next_batch(self) -> list[tuple[Any, Any]]:
        while not self._pending:
            msg = self._get(_POLL_S)
            if self._stopping.is_set():
                return []
            if msg is not None:
                self.handle(msg)
        self._drain_now()
        if self._should_wait():
            self._gather(time.monotonic() + self.max_batch_wait_s)
        n = min(self.max_batch_size, len(self._pending))
        return [self._pending.popleft() for _ in range(n)]

    def _should_wait(self) -> bool:
        if self.max_batch_size == 1 or self.max_batch_wait_s == 0:
            return False
        return len(self._pending) >= 2 or self.batch_wait_when_idle

    def _drain_now(self) -> None:
        while (msg := self._get(0)) is not None:
            self.handle(msg)

    def _gather(self, deadline: float) -> None:
        while self._pending and len(self._pending) < self.max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                return
            msg = self._get(min(remaining, _POLL_S))
            if msg is not None:
                self.handle(msg)

    def _run(self, batch: list[tuple[Any, Any]]) -> None:
        batch = [(rid, p) for rid, p in batch if not self.is_aborted(rid)]
        if not batch:
            return
        if self.batch_fn is not None:
            self._run_batch(batch)
        else:
            for rid, payload in batch:
                self._run_one(rid, payload)

    def _run_one(self, request_id: Any, payload: Any) -> None:
        _emitter.send = lambda chunk: self.put_chunk(request_id, chunk)
        try:
            result = self.fn(payload)
        except RequestAborted:
            return
        except Exception as exc:  # the stage's failure belongs to this request only
            self.put_error(request_id, exc)
            return
        finally:
            _emitter.send = None
        self.put_result(request_id, result)

    def _run_batch(self, batch: list[tuple[Any, Any]]) -> None:
        try:
            results = list(self.batch_fn([payload for _, payload in batch]))
            if len(results) != len(batch):
                raise PipelineError(f"batch_fn returned {len(results)} results for {len(batch)} requests")
        except Exception as exc:
            for rid, _ in batch:
                self.put_error(rid, exc)
            return
        for (rid, _), result in zip(batch, results):
            if isinstance(result, BaseException):
                self.put_error(rid, result)
            else:
                self.put_result(rid, result)


def _queue(scheduler: SimpleScheduler | ContinuousScheduler, msg: Message) -> None:
    """A request-at-a-time scheduler's inbox: a new request waits its turn (unless already
    aborted), an abort takes it out of the queue, a stream chunk is refused."""
    if msg.kind == NEW_REQUEST:
        if not scheduler.is_aborted(msg.request_id):
            scheduler._pending.append((msg.request_id, msg.data))
    elif msg.kind == ABORT:
        scheduler._pending = collections.deque(p for p in scheduler._pending if p[0] != msg.request_id)
    elif msg.kind in (STREAM_CHUNK, STREAM_DONE):
        scheduler.put_error(msg.request_id, PipelineError("this stage does not consume stream chunks"))


class ContinuousScheduler(Scheduler):
    """Requests served together by a continuous stage, a step at a time: the stage object has
    ``join(request_id, payload)`` (start a request: its result if it is done at once, else None),
    ``step()`` (one step for every request joined: ``[(request_id, result), ...]`` for those that
    ended), ``drop(request_id)``, ``active()`` and ``max_active`` (``ffai.kit.stages
    .BatchedTextDecoder``: windows decoded together, one token per step).

    Between two steps every waiting request joins while fewer than ``max_active`` are active, so
    one that arrives mid-way joins at the next step, and a result goes out the moment its request
    ends, never held for the others; one the stage has no room for yet (``join`` raises
    ``ffai.engines.contract.NoRoomYet``) waits, first in line, until a request ends. An idle stage
    takes a lone request at once. A request's chunks may be emitted from any later step
    (:func:`emitter`, captured when it joins). An exception from ``join`` fails its request alone;
    one from ``step`` fails the requests that step served. ``run(fn, *args)`` runs each call (the
    process's compute thread, where stages take turns: each step is one turn); ``after`` runs
    after a call that ended requests.
    """

    def __init__(
        self,
        stage: Any,
        run: Callable[..., Any] | None = None,
        after: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        if stage.max_active < 1:
            raise PipelineError("a continuous stage's max_active must be >= 1")
        self.stage = stage
        self._run = run or (lambda fn, *args: fn(*args))
        self._after = after or (lambda: None)
        self._pending: collections.deque[tuple[Any, Any]] = collections.deque()
        self._joined: set[Any] = set()

    def start(self) -> None:
        while not self._stopping.is_set():
            if not self._joined and not self._pending:
                msg = self._get(_POLL_S)
                if msg is not None:
                    self.handle(msg)
                continue
            while (msg := self._get(0)) is not None:
                self.handle(msg)
            while self._pending and len(self._joined) < self.stage.max_active:
                if not self._join(*self._pending.popleft()):
                    break  # no room until a request ends: step the ones joined
            if self._joined:
                self._step()

    def handle(self, msg: Message) -> None:
        _queue(self, msg)
        if msg.kind == ABORT and msg.request_id in self._joined:
            self._joined.discard(msg.request_id)
            self._run(self.stage.drop, msg.request_id)

    def _join(self, request_id: Any, payload: Any) -> bool:
        """Join one request; False when the stage has no room for it yet (it waits, first in line)."""
        try:
            result = self._run(self._joining, request_id, payload)
        except NoRoomYet:
            if not self._joined:  # nothing to wait for: a stage alone must take it or fail it
                self.put_error(request_id, PipelineError("the stage has no room for a request even alone"))
                return True
            self._pending.appendleft((request_id, payload))
            return False
        except Exception as exc:  # this request's failure alone
            self.put_error(request_id, exc)
            self._after()
            return True
        if result is None:
            self._joined.add(request_id)
        else:
            self.put_result(request_id, result)
            self._after()
        return True

    def _joining(self, request_id: Any, payload: Any) -> Any:
        _emitter.send = lambda chunk: self._chunk(request_id, chunk)
        try:
            return self.stage.join(request_id, payload)
        finally:
            _emitter.send = None

    def _chunk(self, request_id: Any, chunk: Any) -> None:
        # From a step serving many requests: an aborted one's chunks are dropped, never raised.
        if not self.is_aborted(request_id):
            self.outbox.put(Message(STREAM, request_id, chunk))

    def _step(self) -> None:
        try:
            ended = self._run(self.stage.step)
        except Exception as exc:  # one step serves them all
            for request_id in list(self._joined):
                self._run(self.stage.drop, request_id)
                self.put_error(request_id, exc)
            self._joined.clear()
            self._after()
            return
        for request_id, result in ended:
            self._joined.discard(request_id)
            self.put_result(request_id, result)
        if ended:
            self._after()


class ContinuousWrapper:
    """A continuous stage around another, each call passed through: a subclass overrides what it
    adds around them (timing, streaming)."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage
        self.max_active = stage.max_active

    def join(self, request_id: Any, payload: Any) -> Any:
        return self.stage.join(request_id, payload)

    def step(self) -> list:
        return self.stage.step()

    def drop(self, request_id: Any) -> None:
        self.stage.drop(request_id)

    def active(self) -> int:
        return self.stage.active()

    def __call__(self, payload: Any) -> Any:
        return self.stage(payload)


def is_continuous(stage: Any) -> bool:
    """Whether a factory built a continuous stage (``ffai.pipeline.scheduler.ContinuousScheduler``)."""
    return all(callable(getattr(stage, name, None)) for name in ("join", "step", "drop", "active"))


def emitter() -> Callable[[Any], None]:
    """The way to stream chunks of the request the calling stage function is working on, kept for
    later: a continuous stage emits a request's chunks from steps that serve many."""
    send = getattr(_emitter, "send", None)
    if send is None:
        raise PipelineError("emitter() is only available inside a stage function")
    return send


class StreamState:
    """What a :class:`StreamingScheduler` knows about one request so far."""

    __slots__ = ("payload", "has_request", "done", "chunks", "data")

    def __init__(self) -> None:
        self.payload: Any = None
        self.has_request = False
        self.done = False
        self.chunks: list[Any] = []
        self.data: dict[str, Any] = {}  # free space for subclasses


class StreamingScheduler(Scheduler):
    """Base for a stage that consumes stream chunks from an upstream producer.

    Chunks may arrive before or after the request itself. Subclasses override
    :meth:`on_chunk` (default: keep the chunk in ``state.chunks``) and :meth:`on_finish`,
    which runs once both the request's payload and ``stream_done`` have arrived and
    returns the result. Either may call ``self.emit(request_id, chunk)`` to stream onward.
    An exception in either fails only that request.
    """

    def __init__(self) -> None:
        super().__init__()
        self._states: dict[Any, StreamState] = {}

    def on_chunk(self, request_id: Any, chunk: Any, state: StreamState) -> None:
        state.chunks.append(chunk)

    @abc.abstractmethod
    def on_finish(self, request_id: Any, payload: Any, state: StreamState) -> Any:
        """The request's result, once its stream is done."""

    def emit(self, request_id: Any, chunk: Any) -> None:
        self.put_chunk(request_id, chunk)

    def handle(self, msg: Message) -> None:
        rid = msg.request_id
        if msg.kind == ABORT:
            self._states.pop(rid, None)
            return
        if self.is_aborted(rid):
            return
        state = self._states.setdefault(rid, StreamState())
        try:
            if msg.kind == NEW_REQUEST:
                state.payload, state.has_request = msg.data, True
            elif msg.kind == STREAM_CHUNK:
                self.on_chunk(rid, msg.data, state)
            elif msg.kind == STREAM_DONE:
                state.done = True
            if state.has_request and state.done:
                del self._states[rid]
                self.put_result(rid, self.on_finish(rid, state.payload, state))
        except RequestAborted:
            self._states.pop(rid, None)
        except Exception as exc:
            self._states.pop(rid, None)
            self.put_error(rid, exc)
            self._aborted.add(rid)  # later chunks of a failed request are noise
