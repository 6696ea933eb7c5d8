"""The coordinator: the pipeline as the main process sees it.

::

    with Coordinator(config, max_in_flight=4) as pipe:       # placement="inline": threads, no processes
        future = pipe.submit("img-1", payload)                # blocks while 4 are in flight
        caption = future.result()                             # or raises StageError
        stream = pipe.stream("img-2", payload)
        for chunk in stream:                                  # chunks as they come ...
            print(chunk, end="")
        caption = stream.result()                             # ... then the result
        for fut in pipe.as_completed((w.id, w) for w in windows):   # lazily fed, completion order
            cues[fut.request_id] = fut.result()
        for fut in pipe.as_completed(pairs, on_chunk=show):   # show(request_id, chunk) first
            ...

- ``submit(request_id, payload)`` returns a :class:`RequestFuture` (a
  ``concurrent.futures.Future`` with ``request_id``), so ``concurrent.futures.wait`` and
  ``as_completed`` work on it too. At most ``max_in_flight`` requests are in flight;
  ``submit`` blocks for a free slot (backpressure).
- ``stream(request_id, payload)`` returns a :class:`RequestStream`: iterate for the chunks,
  then ``result()``; closing it before the end aborts the request.
- ``as_completed(pairs, on_chunk=...)`` streams every request: ``on_chunk(request_id, chunk)``
  runs on the iterating thread for each chunk, in arrival order, each request's chunks before
  its future is yielded.
- ``abort(request_id)`` fails the request with :class:`RequestAborted` and tells every
  stage to drop it. A stage error fails only its request, with a :class:`StageError`
  carrying the stage's message, and every stage drops that request's partial state.
- A worker that dies fails every pending request within a second or so with
  :class:`WorkerDied`; later ``submit`` calls raise it. ``close()`` always stops the
  workers (use the coordinator as a context manager).
- ``placement`` is where the stages run: ``"workers"`` (spawned worker processes, grouped
  by ``process``) or ``"inline"`` (threads of this process). Choosing one for a caption run
  is ``ffai.run.captioner.placement``'s job; the coordinator only carries it out.

Request ids are the caller's (any hashable value, unique among requests in flight); on
the wire each request gets a fresh integer, so an id may be reused after it finished.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from concurrent.futures import Future
from functools import partial
from typing import Any, Callable, Hashable, Iterable, Iterator

from ffai import messages
from ffai.pipeline.config import PipelineConfig
from ffai.pipeline.errors import PipelineError, RequestAborted, StageError, WorkerDied
from ffai.pipeline.messages import ERROR, NEW_REQUEST, RESULT, SAY, STATS, STREAM, Message
from ffai.pipeline.runner import InlineRunner, ProcessRunner

log = logging.getLogger(__name__)

_MONITOR_POLL_S = 0.2
PLACEMENTS = ("inline", "workers")
_DONE = object()  # ends a stream's chunk queue, or an iterator


def _tagged(put: Callable[[Any], None], request_id: Hashable, chunk: Any) -> None:
    put((request_id, chunk))


class RequestFuture(Future):
    def __init__(self, request_id: Hashable) -> None:
        super().__init__()
        self.request_id = request_id


class _Request:
    __slots__ = ("request_id", "wire_id", "future", "on_chunk")

    def __init__(self, request_id: Hashable, wire_id: int, on_chunk: Callable[[Any], None] | None) -> None:
        self.request_id = request_id
        self.wire_id = wire_id
        self.future = RequestFuture(request_id)
        self.future.set_running_or_notify_cancel()  # in flight at once; abort() cancels
        # Called on the pump thread with each stream chunk; None: the chunks are not wanted.
        self.on_chunk = on_chunk


class RequestStream:
    """Iterate for the request's stream chunks; then ``result()`` gives the final result.

    If the request fails, iteration raises its error after the chunks that came first.
    ``close()`` (also on ``with`` exit or garbage collection) aborts an unfinished request.
    """

    def __init__(self, coordinator: Coordinator, request: _Request, chunks: queue.Queue[Any]) -> None:
        self._coordinator = coordinator
        self._request = request
        self._chunks = chunks
        self._ended = False

    @property
    def future(self) -> RequestFuture:
        return self._request.future

    def __iter__(self) -> RequestStream:
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        item = self._chunks.get()
        if item is not _DONE:
            return item
        self._ended = True
        exc = self.future.exception()
        if exc is not None:
            raise exc
        raise StopIteration

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result(timeout)

    def close(self) -> None:
        self._ended = True
        if not self.future.done():
            self._coordinator._abort_wire(self._request.wire_id)

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finalizer (e.g. at interpreter exit)
            pass


class Coordinator:
    def __init__(
        self,
        config: PipelineConfig,
        *,
        placement: str = "workers",
        max_in_flight: int = 4,
        start_timeout: float = 60.0,
        stop_timeout: float = 5.0,
    ) -> None:
        if max_in_flight < 1:
            raise PipelineError("max_in_flight must be at least 1")
        if placement not in PLACEMENTS:
            raise PipelineError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        inline = placement == "inline"
        config.validate(crossing_processes=not inline)
        self.config = config
        self.max_in_flight = max_in_flight
        self._entry = config.entry_stage()
        self._runner = InlineRunner(config) if inline else ProcessRunner(config, start_timeout, stop_timeout)
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()
        self._requests: dict[int, _Request] = {}  # by wire id
        self._wire_ids: dict[Hashable, int] = {}  # caller's id -> wire id
        self._counter = itertools.count()
        self._stats: dict[int, tuple[dict[str, Any], threading.Event]] = {}
        self._broken: PipelineError | None = None
        self._started = False
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Coordinator:
        if self._started or self._closing.is_set():
            raise PipelineError("a coordinator starts once; make a new one")
        self._runner.start()
        self._started = True
        for target, name in ((self._pump, "ffai-pipeline-pump"), (self._monitor, "ffai-pipeline-monitor")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        """Fail whatever is still in flight, stop every worker, release the queues."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._fail_all(PipelineError("the pipeline was closed"))
        for thread in self._threads:
            thread.join(2.0)
        if self._started:
            self._runner.stop()

    def __enter__(self) -> Coordinator:
        return self if self._started else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------

    def submit(
        self,
        request_id: Hashable,
        payload: Any,
        *,
        timeout: float | None = None,
        on_chunk: Callable[[Any], None] | None = None,
    ) -> RequestFuture:
        """Send a request to the entry stage; block while ``max_in_flight`` are in flight.
        ``on_chunk`` takes the request's stream chunks, on the pump thread, before its future
        finishes (for a caller with its own loop; ``as_completed`` delivers them on its own)."""
        return self._submit(request_id, payload, timeout, on_chunk=on_chunk).future

    def stream(self, request_id: Hashable, payload: Any, *, timeout: float | None = None) -> RequestStream:
        chunks: queue.Queue[Any] = queue.Queue()
        request = self._submit(request_id, payload, timeout, on_chunk=chunks.put)
        # The future is finished on the pump thread after the request's last chunk was queued.
        request.future.add_done_callback(lambda _: chunks.put(_DONE))
        return RequestStream(self, request, chunks)

    def abort(self, request_id: Hashable) -> bool:
        """Abort a request in flight; False if it is not (finished or unknown)."""
        with self._lock:
            wire_id = self._wire_ids.get(request_id)
        return wire_id is not None and self._abort_wire(wire_id)

    def as_completed(
        self,
        requests: Iterable[tuple[Hashable, Any]],
        on_chunk: Callable[[Hashable, Any], None] | None = None,
    ) -> Iterator[RequestFuture]:
        """Submit ``(request_id, payload)`` pairs lazily, at most ``max_in_flight`` at once,
        and yield their futures as they finish. Leaving the loop early aborts the rest.

        With ``on_chunk``, ``on_chunk(request_id, chunk)`` is called for every stream chunk, here
        on the iterating thread, in arrival order: each request's chunks before its future."""
        # Futures and chunks share one queue, so they come out in the order the pump put them.
        done: queue.Queue[RequestFuture | tuple[Hashable, Any]] = queue.Queue()
        outstanding: set[RequestFuture] = set()
        pairs = iter(requests)
        try:
            while True:
                while len(outstanding) < self.max_in_flight and (pair := next(pairs, _DONE)) is not _DONE:
                    request_id, payload = pair
                    sink = None if on_chunk is None else partial(_tagged, done.put, request_id)
                    future = self._submit(request_id, payload, None, on_chunk=sink).future
                    outstanding.add(future)
                    future.add_done_callback(done.put)
                if not outstanding:
                    return
                item = done.get()
                if not isinstance(item, RequestFuture):
                    on_chunk(*item)
                    continue
                outstanding.discard(item)
                yield item
        finally:
            for future in outstanding:
                self.abort(future.request_id)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._requests)

    def worker_pids(self) -> dict[str, int]:
        """Worker process name -> pid (empty inline)."""
        return self._runner.worker_pids()

    def pending_state(self, timeout: float = 10.0) -> dict[str, dict[str, int]]:
        """Each stage's pending counts (``waiting_fan_in``, ``active``), asked of the workers."""
        token = next(self._counter)
        replies: dict[str, Any] = {}
        answered = threading.Event()
        with self._lock:
            self._stats[token] = (replies, answered)
        self._runner.request_stats(token)
        try:
            if not answered.wait(timeout):
                raise PipelineError(f"the workers did not report their state within {timeout:g} s")
        finally:
            with self._lock:
                self._stats.pop(token, None)
        return {stage: counts for worker in replies.values() for stage, counts in worker.items()}

    # -- internals ------------------------------------------------------------------------

    def _submit(
        self,
        request_id: Hashable,
        payload: Any,
        timeout: float | None,
        on_chunk: Callable[[Any], None] | None = None,
    ) -> _Request:
        self._check_usable()
        if not self._slots.acquire(timeout=timeout):
            raise PipelineError(f"no free slot for request {request_id!r} within {timeout:g} s")
        try:
            with self._lock:
                self._check_usable()
                if request_id in self._wire_ids:
                    raise PipelineError(f"request {request_id!r} is already in flight")
                request = _Request(request_id, next(self._counter), on_chunk)
                self._requests[request.wire_id] = request
                self._wire_ids[request_id] = request.wire_id
        except BaseException:
            self._slots.release()
            raise
        try:
            self._runner.send(self._entry, Message(NEW_REQUEST, request.wire_id, payload))
        except Exception as e:
            error = PipelineError(f"request {request_id!r} cannot be sent to stage {self._entry!r}: {e}")
            self._finish(request.wire_id, error=error)
            raise error from e
        return request

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise self._broken
        if not self._started or self._closing.is_set():
            raise PipelineError("the pipeline is not running (start() it, or use it in a with block)")

    def _abort_wire(self, wire_id: int) -> bool:
        request = self._requests.get(wire_id)
        name = request.request_id if request is not None else wire_id
        if not self._finish(wire_id, error=RequestAborted(f"request {name!r} was aborted")):
            return False
        self._runner.abort_everywhere(wire_id)
        return True

    def _finish(self, wire_id: int, result: Any = None, error: BaseException | None = None) -> bool:
        with self._lock:
            request = self._requests.pop(wire_id, None)
            if request is None:
                return False
            del self._wire_ids[request.request_id]
        # Free the slot before waking the caller, so it can submit again at once.
        self._slots.release()
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)
        return True

    def _fail_all(self, error: PipelineError) -> None:
        with self._lock:
            wire_ids = list(self._requests)
        for wire_id in wire_ids:
            self._finish(wire_id, error=error)

    def _pump(self) -> None:
        while not self._closing.is_set():
            try:
                msg = self._runner.recv(0.1)
                if msg is not None:
                    self._dispatch(msg)
            except Exception:
                if self._closing.is_set():
                    return
                log.exception("pipeline coordinator: a message from the workers could not be handled")

    def _dispatch(self, msg: Message) -> None:
        if msg.kind == RESULT:
            self._finish(msg.request_id, result=msg.data)
        elif msg.kind == ERROR:
            self._on_error(msg)
        elif msg.kind == STREAM:
            request = self._requests.get(msg.request_id)
            if request is not None and request.on_chunk is not None:
                request.on_chunk(msg.data)
        elif msg.kind == STATS:
            self._on_stats(msg)
        elif msg.kind == SAY:  # a worker's message, said in this process
            messages.say_again(*msg.data)

    def _on_error(self, msg: Message) -> None:
        request = self._requests.get(msg.request_id)
        if request is None:
            return
        # Sibling branches and fan-in stages may still hold parts of this request; tell
        # them before the caller wakes, so whatever it asks the stages next comes after.
        self._runner.abort_everywhere(msg.request_id)
        error = StageError(request.request_id, msg.source, msg.data.message, msg.data.traceback)
        self._finish(msg.request_id, error=error)

    def _on_stats(self, msg: Message) -> None:
        with self._lock:
            entry = self._stats.get(msg.request_id)
        if entry is not None:
            replies, answered = entry
            replies[msg.source] = msg.data
            if len(replies) >= self._runner.n_workers:
                answered.set()

    def _monitor(self) -> None:
        while not self._closing.wait(_MONITOR_POLL_S):
            dead = self._runner.dead_workers()
            if dead:
                name, pid, code = dead[0]
                error = WorkerDied(f"worker {name!r} (pid {pid}) died with exit code {code}; the pipeline stopped")
                with self._lock:  # under the lock, so no submit slips in after _fail_all looks
                    self._broken = error
                self._fail_all(error)
                return
