"""What ffai says to the user besides its tracks: notes, warnings and errors, through one
channel, the ``ffai`` logger.

Library code says them with :func:`note`, :func:`warn` and :func:`error`; a module that logs to
its own logger under ``ffai`` (``ffai.media``) says them on the same channel. A message is a
level and a text, nothing else, so it crosses a process as two values: ``ffai.media``'s decoder
children send theirs to the parent, which logs them again.

Who shows them:

* the command line, through one handler (``ffai.cli``): ``ffai: warning: …``, ``ffai: error: …``,
  and ``ffai: …`` for a note, each on one line (:meth:`Message.line`); ``-q`` keeps the errors;
* a program that calls ffai and configures no logging sees the warnings and errors on stderr
  (logging's last resort), not the notes (a run's summary);
* :func:`collect` hands them over as values, to a caller that looks at them (tests, benches).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Literal

LOGGER = "ffai"
NOTE = logging.INFO  # below what logging shows by default: a listener asks for notes (listen)

Level = Literal["note", "warning", "error"]
_PREFIX = {"note": "ffai: ", "warning": "ffai: warning: ", "error": "ffai: error: "}

_logger = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class Message:
    level: Level
    text: str

    @classmethod
    def from_record(cls, record: logging.LogRecord) -> Message:
        """The message a record logged under ``ffai`` carries."""
        if record.levelno >= logging.ERROR:
            level = "error"
        elif record.levelno >= logging.WARNING:
            level = "warning"
        else:
            level = "note"
        return cls(level, record.getMessage())

    def line(self) -> str:
        """As the command line prints it: one line, whatever line breaks the text holds."""
        return _PREFIX[self.level] + " ".join(self.text.split())


def note(text: str) -> None:
    """Something to know that is no problem (a run's summary)."""
    _logger.log(NOTE, "%s", text)


def warn(text: str) -> None:
    """Something to know about a run that goes on as asked (a fallback model, dropped windows)."""
    _logger.warning("%s", text)


def error(text: str) -> None:
    """A failure the run goes on past (one input of several)."""
    _logger.error("%s", text)


def say_again(levelno: int, text: str) -> None:
    """A message another process said (a pipeline worker's), said here at its level."""
    _logger.log(levelno, "%s", text)


def listen(handler: logging.Handler) -> None:
    """Hand every message, notes included, to ``handler`` too; once, however often called."""
    if handler not in _logger.handlers:
        _logger.addHandler(handler)
    if _logger.getEffectiveLevel() > NOTE:
        _logger.setLevel(NOTE)


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(NOTE)
        self.said: list[Message] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(Message.from_record(record))


@contextmanager
def collect() -> Iterator[list[Message]]:
    """The messages said in this process inside the block, in order, as values."""
    collector = _Collector()
    level = _logger.level
    listen(collector)
    try:
        yield collector.said
    finally:
        _logger.removeHandler(collector)
        _logger.setLevel(level)
