"""What travels between the coordinator, the stages and their schedulers.

One small record, :class:`Message`, carries every kind. Its ``request_id`` is the
pipeline's own wire id (an int the coordinator assigns), so a caller may reuse its ids
after an abort without a stage mistaking the new request for the aborted one.

Into a scheduler (through its stage): ``new_request`` (``data`` is the payload, ``source``
the stage that sent it, ``None`` for the coordinator), ``stream_chunk`` (``data`` is one
chunk), ``stream_done`` and ``abort``.

Out of a scheduler: ``result`` (``data`` is the result), ``stream`` (``data`` is one chunk)
and ``error`` (``data`` is an :class:`ErrorInfo`). A stage forwards these with ``source``
set to its own name.

Worker bookkeeping (to the coordinator only): ``ready``, ``failed`` (``data`` is the
traceback text), ``stats`` and ``say`` (``data`` is the (logging level, text) of a message the
worker said through ``ffai.messages``, which the coordinator's process says again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NEW_REQUEST = "new_request"
STREAM_CHUNK = "stream_chunk"
STREAM_DONE = "stream_done"
ABORT = "abort"

RESULT = "result"
STREAM = "stream"
ERROR = "error"

READY = "ready"
FAILED = "failed"
STATS = "stats"
SAY = "say"

# The reserved target name for the coordinator: a terminal stage's result and the stream
# chunks of a stage without ``stream_to`` go there.
CALLER = "@caller"


@dataclass(frozen=True, slots=True)
class Message:
    kind: str
    request_id: Any
    data: Any = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a stage failed a request: ``message`` is ``"Type: text"`` of the exception."""

    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException, traceback_text: str = "") -> ErrorInfo:
        return cls(f"{type(exc).__name__}: {exc}", traceback_text)
