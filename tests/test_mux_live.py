"""A live source copied into Matroska by a real ``ffai caption`` process: the demo model's scenes
sent at real-time pace into its standard input. The file is valid while it grows, and after
Ctrl-C or a stall it holds every cue that finished, with the video up to the last one."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import av
import pytest

from ffai.bench import demo_scenes
from live_sources import start_caption
from live_stream import Pacer, encode_ts, paced_chunks

SCENES = demo_scenes.CLIP_SCENES[:3]
SECONDS_PER_SCENE = 2.0
SAMPLING = ["--model", "smolvlm-demo", "--fps", "2", "--window", "2"]  # one cue a second


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> bytes:
    return encode_ts(SCENES, SECONDS_PER_SCENE)


def expected(start_s: int) -> tuple[int, int, str]:
    """The cue of the window at ``start_s``: each window lies inside one scene, which the demo
    model names (as the same clip read as a file gives, tests/test_live.py)."""
    return start_s * 1000, start_s * 1000 + 1000, demo_scenes.caption(SCENES[int(start_s // SECONDS_PER_SCENE)])


def cues_in(path: Path) -> list[tuple[int, int, str]]:
    """The subtitle cues of a (possibly growing) Matroska file."""
    with av.open(str(path)) as container:
        stream = container.streams.subtitles[0]
        return [
            (round(p.pts * p.time_base * 1000), round((p.pts + p.duration) * p.time_base * 1000), bytes(p).decode())
            for p in container.demux(stream)
            if p.size
        ]


def video_times(path: Path) -> list[float]:
    with av.open(str(path)) as container:
        return [float(p.pts * p.time_base) for p in container.demux(container.streams.video[0]) if p.size]


def send(run, clip: bytes, stop_after: float | None = None) -> threading.Thread:
    """The clip into the run's stdin at real-time pace, on a thread (up to ``stop_after`` s)."""
    stdin = run.process.stdin.buffer

    def write(data: bytes) -> None:
        try:
            stdin.write(data)
            stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the run was stopped

    thread = threading.Thread(target=Pacer(paced_chunks(clip)).run, args=(write, stop_after), daemon=True)
    thread.start()
    return thread


def wait_for_cues(path: Path, count: int, timeout: float = 60) -> list[tuple[int, int, str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                found = cues_in(path)
            except av.FFmpegError:
                found = []  # caught between two writes
            if len(found) >= count:
                return found
        time.sleep(0.1)
    raise AssertionError(f"{path} did not reach {count} cues in {timeout} s")


def test_ctrl_c_leaves_a_matroska_file_with_every_finished_cue(clip, tmp_path):
    out = tmp_path / "live.mkv"
    run = start_caption("-i", "-", *SAMPLING, "-o", str(out), stdin=subprocess.PIPE)
    sender = send(run, clip)
    try:
        growing = wait_for_cues(out, 2)  # the file is placed at its first cue and is valid as it grows
        assert growing[:2] == [expected(0), expected(1)]
        run.process.send_signal(signal.SIGINT)
        assert run.wait(timeout=60) == 130, run.stderr
    finally:
        run.process.kill()
        sender.join(10)
    assert "Traceback" not in run.stderr
    cues = cues_in(out)
    assert len(cues) >= 2 and cues == [expected(s) for s in range(len(cues))]
    times = video_times(out)
    assert times[0] == 0.0 and cues[-1][1] / 1000 - 0.1 <= times[-1] < 6.0  # video to the last cue's end
    assert [p.name for p in tmp_path.iterdir()] == ["live.mkv"]  # no temporary file left


def test_a_stall_ends_in_one_error_and_a_file_with_the_cues_delivered(clip, tmp_path):
    out = tmp_path / "stalled.mkv"
    run = start_caption("-i", "-", *SAMPLING, "--stall-timeout", "1.5", "-o", str(out), stdin=subprocess.PIPE)
    sender = send(run, clip, stop_after=3.0)  # then the sender hangs, its pipe still open
    try:
        assert run.wait(timeout=60) == 1, run.stderr
    finally:
        run.process.stdin.close()
        sender.join(10)
    errors = [line for line in run.stderr.splitlines() if line.startswith("ffai: error:")]
    assert errors == ["ffai: error: stdin: the source stalled: no video for 1.5 s (--stall-timeout)"], run.stderr
    assert cues_in(out) == [expected(0), expected(1), expected(2)]
    assert max(video_times(out)) < 3.0


def test_a_live_source_into_mp4_is_refused_before_any_work(capsys):
    from ffai.cli import run

    assert run(["caption", "-i", "-", "-o", "live.mp4"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "ffai: error: stdin: a live source cannot go into MP4, whose index is written only at the end; use -o out.mkv"
    )
