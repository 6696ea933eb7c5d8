"""Live sources on loopback, through real protocols and a real ``ffai caption`` process: a clip
of the demo model's scenes sent at real-time pace through a pipe, over UDP, and from an HTTP
server (a finished file, a chunked response that grows), each captioned as the same clip read
as a file is; a slow engine that makes windows drop, --no-drop, a stall, timestamp jumps."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from ffai import media
from ffai.bench import demo_scenes
from ffai.cli import run as run_cli
from ffai.outputs.cues import Cue
from ffai.run import live
from ffai.run.windows import make_windows
from live_sources import SLOW_ENV, SLOW_NAME, ffai_env, register_slow_engine, start_caption, timeline
from live_stream import (
    Pacer,
    StreamServer,
    encode_ts,
    free_udp_port,
    paced_chunks,
    send_udp,
    udp_port_bound,
)

SCENES = demo_scenes.CLIP_SCENES[:3]
SECONDS_PER_SCENE = 2.0
WINDOWS = 6  # --fps 2 --window 2: one window a second
SAMPLING = ["--model", "smolvlm-demo", "--fps", "2", "--window", "2"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("live") / "clip.ts"
    path.write_bytes(encode_ts(SCENES, SECONDS_PER_SCENE))
    return path


@pytest.fixture(scope="module")
def file_cues(clip):
    """The clip captioned as a file: what every live run of it must give."""
    run = start_caption("-i", str(clip), *SAMPLING, "-f", "jsonl", "-o", "-")
    assert run.wait() == 0, run.stderr
    cues = timeline(run.cues())
    assert len(cues) == WINDOWS
    # Each window lies inside one scene, so the demo model names that scene.
    for start, _, text in cues:
        assert text == demo_scenes.caption(SCENES[int(start // SECONDS_PER_SCENE)])
    return cues


def paced_into(run, clip, stop_after: float | None = None) -> Pacer:
    """Send the clip into the run's standard input at real-time pace."""
    pacer = Pacer(paced_chunks(clip.read_bytes()))
    stdin = run.process.stdin.buffer

    def write(data: bytes) -> None:
        stdin.write(data)
        stdin.flush()

    pacer.run(write, stop_after)
    return pacer


def one_error(stderr: str, *fragments: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("ffai: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert all(f in errors[0] for f in fragments), stderr
    return errors[0]


def test_stdin_at_real_time_gives_the_files_cues_before_the_stream_ends(clip, file_cues):
    run = start_caption("-i", "-", *SAMPLING, "-f", "jsonl", "-o", "-", stdin=subprocess.PIPE)
    pacer = paced_into(run, clip)
    run.process.stdin.close()
    assert run.wait() == 0, run.stderr
    assert timeline(run.cues()) == file_cues
    assert [c["index"] for c in run.cues()] == list(range(1, WINDOWS + 1))
    assert run.lines[0][0] < pacer.finished  # the first cue was out while the sender still sent


def test_udp_stream_then_silence_is_a_stall_after_every_cue(clip, file_cues, tmp_path):
    # UDP has no end of stream: a sender that stops is heard as silence, a stall.
    port = free_udp_port()
    out = tmp_path / "udp.jsonl"
    run = start_caption("-i", f"udp://127.0.0.1:{port}", *SAMPLING, "--stall-timeout", "2", "-o", str(out))
    deadline = time.monotonic() + 60
    while not udp_port_bound(port):
        assert run.process.poll() is None and time.monotonic() < deadline, run.process.stderr.read()
        time.sleep(0.05)
    send_udp(port, Pacer(paced_chunks(clip.read_bytes())))
    assert run.wait() == 1
    one_error(run.stderr, f"udp://127.0.0.1:{port}", "stalled", "--stall-timeout")
    assert timeline([json.loads(line) for line in out.read_text().splitlines()]) == file_cues


def test_http_finished_file_and_growing_chunked_response(clip, file_cues):
    with StreamServer(clip.read_bytes()) as server:
        finished = start_caption("-i", f"{server.url}/clip.ts", *SAMPLING, "-f", "jsonl", "-o", "-")
        growing = start_caption("-i", f"{server.url}/live.ts", *SAMPLING, "-f", "jsonl", "-o", "-")
        assert finished.wait() == 0, finished.stderr
        assert growing.wait() == 0, growing.stderr
    assert timeline(finished.cues()) == file_cues
    assert timeline(growing.cues()) == file_cues
    assert growing.lines[0][0] < server.pacer.finished  # cues while the response still grew
    assert not finished.dropped()  # faster than real time is waited for, never dropped from


def test_a_slow_model_drops_whole_windows_and_the_track_lists_them(clip, file_cues, tmp_path):
    env = ffai_env(register_slow_engine(tmp_path / "plugins"), **{SLOW_ENV: "2"})
    args = ("-i", "-", "--engine", SLOW_NAME, *SAMPLING, "--max-lag", "0.5", "--max-in-flight", "1")
    run = start_caption(*args, "-f", "jsonl", "-o", "-", env=env, stdin=subprocess.PIPE)
    paced_into(run, clip)
    run.process.stdin.close()
    assert run.wait() == 0, run.stderr
    records, cues, dropped = run.records(), run.cues(), run.dropped()
    assert cues and dropped
    # Cues and dropped ranges tile the stream in timeline order, whole windows each.
    assert records[0]["start"] == 0.0 and records[-1]["end"] == file_cues[-1][1]
    assert all(a["end"] == b["start"] for a, b in zip(records, records[1:]))
    assert len(cues) + sum(d["windows"] for d in dropped) == WINDOWS
    assert all(d["end"] - d["start"] == pytest.approx(d["windows"] * 1.0) for d in dropped)
    assert set(timeline(cues)) <= set(file_cues)
    assert [c["index"] for c in cues] == list(range(1, len(cues) + 1))
    total = sum(d["windows"] for d in dropped)
    assert f"ffai: warning: stdin: dropped {total} window(s)" in run.stderr


def test_no_drop_captions_every_window_of_a_slow_model(clip, file_cues, tmp_path):
    env = ffai_env(register_slow_engine(tmp_path / "plugins"), **{SLOW_ENV: "1.5"})
    args = ("-i", "-", "--engine", SLOW_NAME, *SAMPLING, "--no-drop", "--max-in-flight", "1")
    run = start_caption(*args, "-f", "jsonl", "-o", "-", env=env, stdin=subprocess.PIPE)
    pacer = paced_into(run, clip)
    run.process.stdin.close()
    assert run.wait() == 0, run.stderr
    assert timeline(run.cues()) == file_cues and not run.dropped()
    assert run.lines[-1][0] > pacer.finished + 1  # the model was behind, and nothing was skipped
    assert "dropped" not in run.stderr


def test_a_stalled_pipe_ends_with_the_timeout_error_and_a_valid_track(clip, file_cues, tmp_path):
    out = tmp_path / "stalled.json"
    run = start_caption("-i", "-", *SAMPLING, "--stall-timeout", "1.5", "-o", str(out), stdin=subprocess.PIPE)
    paced_into(run, clip, stop_after=3.0)  # then the sender hangs, its pipe still open
    try:
        assert run.wait(timeout=60) == 1
    finally:
        run.process.stdin.close()
    one_error(run.stderr, "stdin: the source stalled: no video for 1.5 s (--stall-timeout)")
    cues = json.loads(out.read_text())["cues"]  # a complete json document
    assert timeline(cues) == file_cues[:3]  # every window the sender delivered, the last included


def test_timestamp_jumps_keep_the_timeline_continuous(tmp_path):
    # A sender that starts at 5 s, restarts at 0, then leaps an hour ahead: ffai's stream time
    # goes on one frame period after the previous frame at each jump (DISCONTINUITY_S).
    fps = demo_scenes.CLIP_FPS
    parts = [
        encode_ts(SCENES[:1], 1.0, first_pts=5 * fps),
        encode_ts(SCENES[1:2], 1.0, first_pts=0),
        encode_ts(SCENES[2:3], 1.0, first_pts=3600 * fps),
    ]
    fifo = tmp_path / "jumps.ts"
    os.mkfifo(fifo)

    def send() -> None:
        with open(fifo, "wb") as f:
            f.write(b"".join(parts))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    frames = list(media.Decoder(stall_timeout=10).sample_frames(str(fifo), fps=fps))
    sender.join(10)
    times = [f.time for f in frames]
    assert times == pytest.approx([i / fps for i in range(3 * fps)])
    cues = [Cue.from_window(w, "") for w in make_windows(frames, 4, fps)]
    assert cues[0].start_ms == 0 and cues[-1].end_ms == 3000
    assert all(a.end_ms == b.start_ms and a.start_ms < a.end_ms for a, b in zip(cues, cues[1:]))


def test_live_sources_are_told_from_files(tmp_path, clip):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert [media.is_live(s) for s in ("-", "udp://127.0.0.1:5000", "https://x/y.ts", str(fifo))] == [True] * 4
    assert [media.is_live(s) for s in (str(clip), f"file://{clip}", str(tmp_path / "missing"))] == [False] * 3


def test_a_protocol_this_ffmpeg_lacks_is_one_line_naming_it(capsys):
    code = run_cli(["caption", "-i", "nosuchproto://127.0.0.1:9/x", "--model", "smolvlm-demo"])
    _, err = capsys.readouterr()
    assert code == 1
    one_error(err, "nosuchproto://", "protocol not found")


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--max-lag", "0"], "--max-lag must be a number of seconds > 0"),
        (["--no-drop", "--max-lag", "5"], "--max-lag and --no-drop contradict each other"),
        (["--stall-timeout", "-1"], "--stall-timeout must be a number of seconds > 0"),
    ],
)
def test_live_flags_are_checked_before_any_work(capsys, flags, fragment):
    code = run_cli(["caption", "-i", "-", "--model", "smolvlm-demo", *flags])
    _, err = capsys.readouterr()
    assert code == 2
    one_error(err, fragment)


class _StreamClock:
    """Wall time that follows the frames handed out: each frame arrives at its own time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def frames(self, count: int, fps: float):
        for i in range(count):
            self.now = i / fps
            yield media.Frame(i / fps, None)


@pytest.mark.parametrize("max_lag", [0.5, 3.0, 10.0])
def test_a_real_time_source_nobody_keeps_up_with_drops_windows_and_never_pauses(max_lag):
    # Nobody takes a window: a real-time source must not be paused by the waiting windows (that
    # would stop its clock, and then no window would ever be late); the late ones are dropped.
    clock = _StreamClock()
    fps, size = 2.0, 2
    windows = live.LiveWindows(clock.frames(120, fps), size, fps, max_lag, clock=clock).start()
    with windows.cond:
        assert windows.cond.wait_for(lambda: windows.ended, timeout=10)
        drops, window = windows.take()
    assert window is not None and windows.dropped_windows == sum(d.windows for d in drops) > 0
    assert window.end >= 60 - max_lag - size / fps  # what is left is no older than max_lag
    assert [d.start_ms for d in drops] == [0] and drops[0].end_ms == round(window.start * 1000)
