"""Ctrl-C that is never lost.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT arrives. Inside a
finaliser (a ``__del__``, such as Ray's ``ObjectRefGenerator`` dropped when an input ends) it is
printed as "Exception ignored" and dropped, and the run went on to its end with exit 0. While
``caught()`` is active, SIGINT also leaves a mark, and the loops that wait on work (the caption
driver, the Ray driver) call ``check()``, which raises it again where it cannot be lost; and the
swallowed one is not printed (its traceback reached a user's terminal beside ``ffai: error:
interrupted``).
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

_pending = False
_deferring = 0  # depth of ``deferred()`` blocks the main thread is in


def _on_sigint(signum: int, frame: object) -> None:
    global _pending
    _pending = True
    if not _deferring:
        raise KeyboardInterrupt


@contextmanager
def caught() -> Iterator[None]:
    """SIGINT is remembered until ``check()`` or the block's end. Only in the main thread, and
    only over Python's own handler (a program that set its own keeps it)."""
    global _pending
    mine = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    if mine:
        previous_hook = sys.unraisablehook

        def quiet_interrupts(unraisable) -> None:
            if not isinstance(unraisable.exc_value, KeyboardInterrupt):  # that one check() raises
                previous_hook(unraisable)

        sys.unraisablehook = quiet_interrupts
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        if mine:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = previous_hook
            _pending = False


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT arrived that no one has raised yet (or whose
    raising a finaliser swallowed)."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """While ``caught()`` is active, a SIGINT inside the block is raised at its end: a step
    that must not be cut in half (a cue written to its file and counted in the run's record)
    happens whole or not at all. Main thread only; elsewhere SIGINT never lands anyway."""
    global _deferring
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring:
        check()
