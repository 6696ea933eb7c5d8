"""Where the command line's messages go: one line each on stderr, ``-q`` keeping only the
errors, ``-v`` adding tracebacks. The library's own messages (``ffai.messages``) come here
through one logging handler; a command's error through ``error``."""

from __future__ import annotations

import logging
import sys

from ffai import messages


class State:
    """The global -v/-q, as the app and the command that ran set them."""

    verbose = False
    quiet = False


def _print(message: messages.Message) -> None:
    """The one place a message becomes a line on stderr; -q keeps only the errors."""
    if message.level == "error" or not State.quiet:
        print(message.line(), file=sys.stderr, flush=True)


def error(text: str) -> None:
    """The command's own one-line error (an FfaiError, bad usage, Ctrl-C)."""
    _print(messages.Message("error", text))


class _Printer(logging.Handler):
    """What the library says (``ffai.messages``, ``ffai.media``'s skipped packets ...)."""

    def emit(self, record: logging.LogRecord) -> None:
        _print(messages.Message.from_record(record))


PRINTER = _Printer(messages.NOTE)
