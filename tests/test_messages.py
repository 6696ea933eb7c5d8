"""ffai.messages, the one channel for what ffai says besides its tracks: how the command line
prints it (and -q silences it), what a program that configures nothing sees, and collect."""

from __future__ import annotations

import logging
import subprocess
import sys

from ffai import messages
from ffai.cli import run


def _say_all() -> None:
    messages.note("3 done, 0 skipped, 0 failed")
    messages.warn("clip.mp4: no frames decoded;\n  the track is empty")
    messages.error("bad.mp4: no such file")
    logging.getLogger("ffai.media").warning("%s: skipped %d video packet(s)", "cut.mp4", 2)


def test_the_cli_prints_every_message_as_one_line_and_q_keeps_the_errors(capsys):
    assert run(["engines"]) == 0  # any command installs the printer
    capsys.readouterr()
    _say_all()
    assert capsys.readouterr().err.splitlines() == [
        "ffai: 3 done, 0 skipped, 0 failed",
        "ffai: warning: clip.mp4: no frames decoded; the track is empty",
        "ffai: error: bad.mp4: no such file",
        "ffai: warning: cut.mp4: skipped 2 video packet(s)",
    ]
    assert run(["-q", "engines"]) == 0
    capsys.readouterr()
    _say_all()
    assert capsys.readouterr().err.splitlines() == ["ffai: error: bad.mp4: no such file"]


def test_collect_hands_the_messages_over_in_order():
    with messages.collect() as said:
        _say_all()
    assert said == [
        messages.Message("note", "3 done, 0 skipped, 0 failed"),
        messages.Message("warning", "clip.mp4: no frames decoded;\n  the track is empty"),
        messages.Message("error", "bad.mp4: no such file"),
        messages.Message("warning", "cut.mp4: skipped 2 video packet(s)"),
    ]
    messages.warn("after the block")
    assert len(said) == 4


def test_a_program_that_configures_no_logging_sees_warnings_and_errors_not_notes():
    code = "from ffai import messages; messages.note('a note'); messages.warn('a warning'); messages.error('an error')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stderr.splitlines() == ["a warning", "an error"]
