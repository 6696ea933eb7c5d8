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

from ffai.pipeline import emit
from ffai.pipeline.config import resolve

# Pieces that come closer together than this go out as one chunk: a reader sees no difference
# from token by token, and a fast model pays for a chunk's trip through the pipeline (threads,
# or a worker's queue), which is not free, once an interval instead of at every token
# (docs/benchmarks.md, *Streaming*).
CHUNK_INTERVAL_S = 0.02


def answer_stage(factory: str, *args: Any) -> Callable[[Any], Any]:
    """The stage ``factory(*args)`` builds, its answer's text pieces streamed as chunks."""
    return partial(_streaming, resolve(factory)(*args))


def _streaming(stage: Callable[..., Any], payload: Any) -> Any:
    pending: list[str] = []
    sent = -CHUNK_INTERVAL_S  # when the last chunk went: the first piece goes at once

    def on_text(piece: str) -> None:
        nonlocal sent
        pending.append(piece)
        if time.monotonic() - sent >= CHUNK_INTERVAL_S:
            emit("".join(pending))
            pending.clear()
            sent = time.monotonic()

    result = stage(payload, on_text=on_text)
    if pending:
        emit("".join(pending))
    return result


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
