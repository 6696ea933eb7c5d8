"""Answers as they are generated: the engine's text pieces as pipeline stream chunks, and those
pieces trimmed to what the cue's text will be.

An engine's last stage reports its answer's text piece by piece through ``on_text`` (the
contract in ``ffai.engine``); :func:`answer_stage` builds that stage so that each piece becomes
a stream chunk of the request (``ffai.pipeline.emit``), the one way chunks leave a stage, inline
or in a worker process. The pieces add up to the answer; a cue's text is the answer stripped
of surrounding whitespace, so :class:`StrippedPieces` holds back what the strip would remove.
This module stays light: a worker process imports it before it builds the stage.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from ffai.pipeline import emit
from ffai.pipeline.config import resolve


def answer_stage(factory: str, *args: Any) -> Callable[[Any], Any]:
    """The stage ``factory(*args)`` builds, its answer's text pieces streamed as chunks."""
    return partial(_streaming, resolve(factory)(*args))


def _streaming(stage: Callable[..., Any], payload: Any) -> Any:
    return stage(payload, on_text=emit)


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
