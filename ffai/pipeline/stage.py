"""A stage: the IO shell around one scheduler.

It feeds the scheduler's inbox (merging fan-in first when the stage has ``wait_for``),
drains its outbox on a thread of its own so the worker's receive loop never blocks on
compute, and sends each output on: results by the routing function compiled at start
(projected per target), stream chunks to ``stream_to`` (or the caller), errors to the
caller. Every output of an aborted request is dropped. The stage treats every scheduler
alike, through the contract in :mod:`ffai.pipeline.scheduler`.

``send(target, message)`` is supplied by the host: ``target`` is a stage name or
:data:`~ffai.pipeline.messages.CALLER`.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any, Callable

from ffai.pipeline.config import StageConfig, resolve
from ffai.pipeline.errors import PipelineError
from ffai.pipeline.messages import (
    ABORT,
    CALLER,
    ERROR,
    NEW_REQUEST,
    RESULT,
    STREAM,
    STREAM_CHUNK,
    STREAM_DONE,
    ErrorInfo,
    Message,
)
from ffai.pipeline.scheduler import BoundedSet, Scheduler

Send = Callable[[str, Message], None]
Router = Callable[[Any], list[str]]


def compile_router(config: StageConfig) -> Router:
    """The stage's routing function, fixed once: result -> target names."""
    if config.terminal:
        return lambda result: [CALLER]
    targets = config.next
    if config.route_fn is None:
        return lambda result: list(targets)
    choose = resolve(config.route_fn)

    def route(result: Any) -> list[str]:
        chosen = choose(result)
        names = [chosen] if isinstance(chosen, str) else list(chosen)
        stray = [n for n in names if n not in targets]
        if stray or not names:
            raise PipelineError(f"route_fn chose {names!r}; it must choose among next={list(targets)!r}")
        return names

    return route


class Stage:
    def __init__(self, config: StageConfig, scheduler: Scheduler, send: Send) -> None:
        self.name = config.name
        self.config = config
        self.scheduler = scheduler
        self._send = send
        self._route = compile_router(config)
        self._project = {t: resolve(fn) for t, fn in config.project_payload.items()}
        self._merge = resolve(config.merge_fn) if config.merge_fn is not None else None
        self._stream_targets = config.stream_to or (CALLER,)
        self._parts: dict[Any, dict[str, Any]] = {}  # fan-in: request id -> source -> payload
        self._active: set[Any] = set()  # requests handed to the scheduler, not yet answered
        self._lock = threading.Lock()
        self._aborted = BoundedSet()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target, role in ((self.scheduler.start, "scheduler"), (self._drain, "drain")):
            thread = threading.Thread(target=target, name=f"{self.name}-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Ask both threads to end; :meth:`join` waits for them."""
        self._stopping.set()
        self.scheduler.stop()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"waiting_fan_in": len(self._parts), "active": len(self._active)}

    def feed(self, msg: Message) -> None:
        """Accept one incoming message; called from the host's receive loop."""
        rid = msg.request_id
        if msg.kind == ABORT:
            self.abort(rid)
            return
        if rid in self._aborted:
            return
        if msg.kind == NEW_REQUEST and self._merge is not None:
            msg = self._fan_in(msg)
            if msg is None:
                return
        with self._lock:
            self._active.add(rid)
        self.scheduler.inbox.put(msg)

    def abort(self, request_id: Any) -> None:
        self._aborted.add(request_id)
        with self._lock:
            self._parts.pop(request_id, None)
            self._active.discard(request_id)
        self.scheduler.abort(request_id)

    def _fan_in(self, msg: Message) -> Message | None:
        rid, wait_for = msg.request_id, self.config.wait_for
        if msg.source not in wait_for:
            self._fail(rid, PipelineError(f"got a request from {msg.source!r}; it waits for {list(wait_for)!r}"))
            return None
        with self._lock:
            parts = self._parts.setdefault(rid, {})
            parts[msg.source] = msg.data
            if len(parts) < len(wait_for):
                return None
            del self._parts[rid]
        try:
            # Keyed by source and ordered as wait_for, whatever order the parts arrived in.
            merged = self._merge({source: parts[source] for source in wait_for})
        except Exception as exc:
            self._fail(rid, exc)
            return None
        return Message(NEW_REQUEST, rid, merged, msg.source)

    def _drain(self) -> None:
        while not self._stopping.is_set():
            try:
                msg = self.scheduler.outbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg.request_id in self._aborted:
                continue
            try:
                self._forward(msg)
            except Exception as exc:  # routing, projection or transport failed this request
                self._fail(msg.request_id, exc)

    def _forward(self, msg: Message) -> None:
        rid = msg.request_id
        if msg.kind == STREAM:
            for target in self._stream_targets:
                kind = STREAM if target == CALLER else STREAM_CHUNK
                self._send(target, Message(kind, rid, msg.data, self.name))
        elif msg.kind == RESULT:
            self._done(rid)
            self._send_result(rid, msg.data)
        elif msg.kind == ERROR:
            self._done(rid)
            self._send(CALLER, Message(ERROR, rid, msg.data, self.name))

    def _send_result(self, rid: Any, result: Any) -> None:
        for target in self.config.stream_to:
            if target != CALLER:
                self._send(target, Message(STREAM_DONE, rid, None, self.name))
        targets = self._route(result)
        # Project every target before sending any, so a failing projection sends nothing.
        payloads = [(t, self._project[t](result) if t in self._project else result) for t in targets]
        for target, payload in payloads:
            kind = RESULT if target == CALLER else NEW_REQUEST
            self._send(target, Message(kind, rid, payload, self.name))

    def _done(self, rid: Any) -> None:
        with self._lock:
            self._active.discard(rid)

    def _fail(self, rid: Any, exc: BaseException) -> None:
        self._done(rid)
        info = ErrorInfo.from_exception(exc, "".join(traceback.format_exception(exc)))
        self._send(CALLER, Message(ERROR, rid, info, self.name))
