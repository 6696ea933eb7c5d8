"""A Ctrl-C that lands in a finaliser is not lost: Python prints it as "Exception ignored" and
drops it (Ray's ObjectRefGenerator.__del__ did this to a --ray run, which then went on to exit 0);
inside ``interrupts.caught()`` the next ``check()`` raises it."""

from __future__ import annotations

import gc
import os
import signal
import sys

import pytest

from ffai.run import interrupts


class _SignalsInFinaliser:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # delivered here, in the finaliser, and swallowed
        for _ in range(1000):
            pass


def _swallowed_ctrl_c() -> None:
    _SignalsInFinaliser()
    gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_swallowed_by_a_finaliser_is_raised_by_check():
    with interrupts.caught():
        _swallowed_ctrl_c()  # no KeyboardInterrupt here: the finaliser ate it
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        interrupts.check()  # raised once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_without_the_guard_the_ctrl_c_is_lost():
    """What the guard is for: Python's own handler leaves nothing for check() to find."""
    _swallowed_ctrl_c()
    interrupts.check()


def test_a_swallowed_ctrl_c_is_not_printed_and_other_finaliser_errors_are(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)

    class Fails:
        def __del__(self) -> None:
            raise ValueError("a finaliser's own error")

    with interrupts.caught():
        _swallowed_ctrl_c()
        Fails()
        gc.collect()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
    assert [type(u.exc_value) for u in seen] == [ValueError]
    assert sys.unraisablehook == seen.append  # the hook given back


def test_a_program_with_its_own_handler_keeps_it():
    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, own)
    try:
        with interrupts.caught():
            assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_inside_a_deferred_step_is_raised_when_the_step_is_whole():
    done = []
    with interrupts.caught():
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler runs between bytecodes: here, and defers
                    pass
                done.append("written")
                done.append("counted")
        interrupts.check()  # raised once
    assert done == ["written", "counted"]


def test_a_deferred_step_without_a_ctrl_c_raises_nothing():
    with interrupts.caught():
        with interrupts.deferred():
            pass
