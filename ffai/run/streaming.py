"""Answers as they are generated: the engine's text pieces as pipeline stream chunks, and those
pieces trimmed to what the cue's text will be.

An engine's last stage reports its answer's text piece by piece through ``on_text`` (the
contract in ``ffai.engines.contract``); :func:`answer_stage` builds that stage so that the pieces become
stream chunks of the request (``ffai.pipeline.emit``, the one way chunks leave a stage, inline
or in a worker process), those that come within ``CHUNK_INTERVAL_S`` of the last chunk as one. The pieces add up to the answer; a cue's text is the answer stripped
of surrounding whitespace, so :class:`StrippedPieces` holds back what the strip would remove.
This module stays light: a worker process imports it before it builds the stage.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

from ffai.pipeline import ContinuousWrapper, emit, emitter, is_continuous
from ffai.pipeline.config import resolve

# Pieces that come closer together than this go out as one chunk: a reader sees no difference
# from token by token, and a fast model pays for a chunk's trip through the pipeline (threads,
# or a worker's queue), which is not free, once an interval instead of at every token
# (docs/benchmarks.md, *Streaming*).
CHUNK_INTERVAL_S = 0.02


def answer_stage(factory: str, *args: Any) -> Any:
    """The stage ``factory(*args)`` builds, its answer's text pieces streamed as chunks; a
    continuous stage (windows decoded together) stays one, each window's pieces its own."""
    stage = resolve(factory)(*args)
    if is_continuous(stage):
        return _StreamingContinuous(stage)
    return partial(_streaming, stage)


class _Chunks:
    """Text pieces into stream chunks through ``send``: the first at once, then those within
    ``CHUNK_INTERVAL_S`` of the last chunk together."""

    def __init__(self, send: Callable[[str], None]) -> None:
        self._send = send
        self._pending: list[str] = []
        self._sent = -CHUNK_INTERVAL_S

    def add(self, piece: str) -> None:
        self._pending.append(piece)
        if time.monotonic() - self._sent >= CHUNK_INTERVAL_S:
            self.flush()
            self._sent = time.monotonic()

    def flush(self) -> None:
        if self._pending:
            self._send("".join(self._pending))
            self._pending.clear()


def _streaming(stage: Callable[..., Any], payload: Any) -> Any:
    chunks = _Chunks(emit)
    result = stage(payload, on_text=chunks.add)
    chunks.flush()
    return result


class _StreamingContinuous(ContinuousWrapper):
    """A continuous stage (``ffai.pipeline.scheduler.ContinuousScheduler``) whose windows stream
    their pieces, each through the way its own request emits (captured when it joins)."""

    def __init__(self, stage: Any) -> None:
        super().__init__(stage)
        self._chunks: dict[Any, _Chunks] = {}

    def join(self, key: Any, payload: Any) -> Any:
        chunks = self._chunks[key] = _Chunks(emitter())
        try:
            result = self.stage.join(key, payload, on_text=chunks.add)
        except BaseException:
            del self._chunks[key]
            raise
        if result is not None:
            self._chunks.pop(key).flush()
        return result

    def step(self) -> list:
        ended = self.stage.step()
        for key, _ in ended:
            self._chunks.pop(key).flush()
        return ended

    def drop(self, key: Any) -> None:
        self._chunks.pop(key, None)
        self.stage.drop(key)

    def __call__(self, payload: Any) -> Any:
        return _streaming(self.stage, payload)


class StrippedPieces:
    """Pieces of an answer in, pieces of the answer stripped of surrounding whitespace out.

    Whitespace before the first visible character is dropped; a run of whitespace after it is
    held until a visible character follows (it is inside the text then) and dropped if none
    does, so the pieces given add up to exactly ``"".join(pieces).strip()``, the cue's text.
    """

    def __init__(self) -> None:
        self._started = False
        self._held = ""  # whitespace that is inside the text only if more text follows

    def add(self, piece: str) -> str:
        """The part of the stripped text that ``piece`` makes certain ("" for none yet)."""
        if not self._started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self._started = True
        body = piece.rstrip()
        if not body:
            self._held += piece
            return ""
        shown = self._held + body
        self._held = piece[len(body) :]
        return shown
