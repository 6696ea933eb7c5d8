"""The caption path on the worker pipeline: library API, cue order, Ctrl-C."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ffai
from ffai.engines.contract import DecodingOptions, Request, RuntimeOptions
from ffai.errors import UsageError
from ffai.pipeline import PipelineError
from ffai.run.captioner import Captioner, pipeline_config, placement
from ffai.run.options import CaptionOptions
from sample_media import make_clip


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory) -> Path:
    return make_clip(tmp_path_factory.mktemp("media") / "long.mp4", 120, fps=10, size=(64, 48))


def test_library_caption_yields_cues_in_order(tiny_checkpoint, tmp_path):
    clip = make_clip(tmp_path / "c.mp4", 5, fps=10, size=(64, 48))
    options = CaptionOptions(model=str(tiny_checkpoint), fps=2, window=2, decoding=DecodingOptions(max_new_tokens=3))
    cues = list(ffai.caption(clip, options))
    assert [c.index for c in cues] == [1, 2, 3, 4, 5]
    assert [c.start_ms for c in cues] == [0, 1000, 2000, 3000, 4000]
    assert all(c.text == c.text.strip() and c.text for c in cues)
    # Each cue carries the tokens behind its text: they decode to it.
    from ffai.engines.smolvlm.prompt import PromptBuilder

    prompts = PromptBuilder.from_dir(tiny_checkpoint)
    assert all(0 < len(c.token_ids) <= 3 and prompts.decode(list(c.token_ids)).strip() == c.text for c in cues)


def test_workers_and_inline_give_the_same_cues(tiny_checkpoint, tmp_path):
    clip = make_clip(tmp_path / "c.mp4", 3, fps=10, size=(64, 48))
    still = tmp_path / "still.png"
    from PIL import Image

    Image.new("RGB", (80, 60), (30, 200, 90)).save(still)
    cues = {}
    for where in ("inline", "workers"):
        options = CaptionOptions(
            model=str(tiny_checkpoint), fps=1, window=2, decoding=DecodingOptions(max_new_tokens=4), placement=where
        )
        with Captioner(options) as captioner:
            assert captioner.placement == where
            cues[where] = [cue for path in (clip, still) for cue in captioner.captions(captioner.decoder.probe(path))]
    assert cues["inline"] == cues["workers"]  # texts, times and token ids
    assert len(cues["inline"]) == 3 and all(c.token_ids for c in cues["inline"])


def test_the_pipeline_starts_only_when_asked(tiny_checkpoint):
    from PIL import Image

    options = CaptionOptions(model=str(tiny_checkpoint), decoding=DecodingOptions(max_new_tokens=2))
    captioner = Captioner(options, video=False)
    request = Request.frames([Image.new("RGB", (40, 30), (200, 40, 40))], [0.0], options.decoding)
    with pytest.raises(PipelineError, match="not started"):
        list(captioner.answers([("a", request)]))
    try:
        assert captioner.start() is captioner and captioner.start() is captioner  # again: a no-op
        [(request_id, answer)] = captioner.answers([("a", request)])
        assert request_id == "a" and 0 < len(answer.token_ids) <= 2
    finally:
        captioner.close()
    with pytest.raises(PipelineError, match="not started"):
        list(captioner.answers([("a", request)]))


def test_threads_are_shared_out_between_workers():
    from ffai.engines.smolvlm import ENGINE

    config = pipeline_config(ENGINE.stages(), Path("/m"), RuntimeOptions(), cores=4)
    assert {p.name: p.threads for p in config.processes} == {"vision": 2, "text": 2}
    config = pipeline_config(ENGINE.stages(), Path("/m"), RuntimeOptions(threads=3), cores=4)
    assert {p.threads for p in config.processes} == {3}
    assert [s.name for s in config.stages] == ["preprocess", "vision", "text"]
    assert config.stage("text").terminal and config.stage("preprocess").next == ("vision",)
    assert not any(p.serial for p in config.processes)
    # On two cores every stage shares one process and they take turns, each with both cores.
    config = pipeline_config(ENGINE.stages(), Path("/m"), RuntimeOptions(), cores=2)
    assert [(p.name, p.threads, p.serial) for p in config.processes] == [("engine", 2, True)]
    assert {s.process for s in config.stages} == {"engine"}


@pytest.mark.parametrize(
    ("choice", "cores", "video", "where"),
    [
        ("auto", 1, True, "inline"),
        ("auto", 2, True, "inline"),
        ("auto", 3, True, "workers"),
        ("auto", 16, False, "inline"),
        ("workers", 2, False, "workers"),
        ("inline", 16, True, "inline"),
    ],
)
def test_placement_follows_cores_and_inputs_unless_asked(monkeypatch, tiny_checkpoint, choice, cores, video, where):
    assert placement(choice, cores=cores, video=video) == where
    monkeypatch.setattr("ffai.run.captioner.available_cores", lambda: cores)
    assert Captioner(CaptionOptions(model=str(tiny_checkpoint), placement=choice), video=video).placement == where


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_in_flight": 0}, "--max-in-flight must be at least 1"),
        ({"fps": 0}, "--fps must be a number > 0, got 0"),
        ({"fps": math.nan}, "--fps must be a number > 0, got nan"),
        ({"window": 0}, "--window must be at least 1, got 0"),
        ({"start": -1}, "-ss must be a number of seconds >= 0, got -1"),
        ({"duration": 0}, "-t must be a number of seconds > 0, got 0"),
        ({"max_frames": 0}, "--max-frames must be at least 1, got 0"),
        ({"placement": "gpu"}, "--placement must be one of auto, inline, workers, got 'gpu'"),
    ],
)
def test_options_are_validated_by_the_cli_rules(kwargs, message):
    with pytest.raises(UsageError) as caught:
        CaptionOptions(**kwargs)
    assert str(caught.value) == message


def _descendants(pid: int) -> set[int]:
    found, stack = set(), [pid]
    while stack:
        p = stack.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found.update(kids)
            stack += kids
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; this container's init may not reap it


def _sigint_as_in_a_terminal() -> None:
    """A process started in the background by a script (CI runners do) inherits SIGINT
    ignored, and Python then never raises KeyboardInterrupt. A Ctrl-C at a terminal reaches a
    foreground process whose SIGINT has its default disposition: give the child that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["workers", "inline"])
def test_sigint_exits_130_keeps_finished_cues_and_leaves_no_worker(tiny_checkpoint, long_clip, tmp_path, where):
    out = tmp_path / "long.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ffai",
            "caption",
            "-i",
            str(long_clip),
            "--model",
            str(tiny_checkpoint),
            "--fps",
            "2",
            "--window",
            "1",
            "--max-new-tokens",
            "4",
            "--placement",
            where,
            "-o",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 2):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    workers = _descendants(proc.pid)
    # Every placement reads its input in decoder processes (ffai.media's fork server and its child).
    decoders = {p for p in workers if b"ffai.media" in _cmdline(p)}
    assert bool(workers - decoders) == (where == "workers"), workers
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - start < 5.0
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == "ffai: error: interrupted", err
    lines = out.read_text().splitlines()
    assert len(lines) >= 2
    cues = [json.loads(line) for line in lines]  # every line is a whole cue
    assert [c["index"] for c in cues] == list(range(1, len(cues) + 1))
    time.sleep(0.5)
    assert not [pid for pid in workers if _alive(pid)]
