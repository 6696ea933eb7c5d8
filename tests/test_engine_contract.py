"""The engine contract holds for an engine ffai has never seen: the palette engine
(tests/minimal_engine.py), registered through the ``ffai.engines`` entry point, runs through
``ffai engines``, ``ffai caption`` on a clip and a still, the library's inline runner, a live
source and a local Ray cluster, with no edit to ffai's core."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from ffai.bench import demo_scenes
from ffai.engines.contract import DecodingOptions, Request
from ffai.run.inline import InlineEngine
from live_sources import ffai_env
from live_stream import encode_ts
from minimal_engine import COLOURS, ENGINE, register_palette_engine, write_checkpoint

DEMO_CLIP = Path(__file__).resolve().parents[1] / "examples" / "demo_clip.mp4"
# The demo clip's four scenes, 3 s each, have these backgrounds; a shape covers little of a frame.
SCENE_COLOURS = ["blue", "black", "green", "grey"]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """(environment with the palette engine registered, its checkpoint folder)."""
    folder = tmp_path_factory.mktemp("palette")
    return ffai_env(register_palette_engine(folder / "plugins")), write_checkpoint(folder / "model")


def ffai(env, *args: str, cwd: Path | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ffai", *args], env=env, cwd=cwd, input=stdin, capture_output=True, timeout=300
    )


def cues_in(lines: str) -> list[tuple[float, float, str]]:
    records = [json.loads(line) for line in lines.splitlines()]
    return [(r["start"], r["end"], r["text"]) for r in records if "index" in r]


def cues_of(done: subprocess.CompletedProcess) -> list[tuple[float, float, str]]:
    assert done.returncode == 0, done.stderr.decode()
    return cues_in(done.stdout.decode())


def expected_clip_cues() -> list[tuple[float, float, str]]:
    # --fps 1 --window 3: a window per scene, its frames at the scene's first three seconds.
    return [
        (3.0 * i, 3.0 * (i + 1), f"{c}, {c}, {c} from {3 * i} s to {3 * (i + 1)} s")
        for i, c in enumerate(SCENE_COLOURS)
    ]


def test_the_engine_is_listed(plugin):
    env, _ = plugin
    done = subprocess.run(
        [sys.executable, "-m", "ffai", "engines", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "palette" in done.stdout and "smolvlm" in done.stdout


def test_caption_a_clip_and_a_still(plugin, tmp_path):
    env, model = plugin
    flags = ["--engine", "palette", "--model", str(model), "-f", "jsonl", "-o", "-"]
    clip = ffai(env, "caption", "-i", str(DEMO_CLIP), "--fps", "1", "--window", "3", *flags)
    assert cues_of(clip) == expected_clip_cues()
    still = tmp_path / "green.png"
    Image.new("RGB", (97, 61), (40, 190, 70)).save(still)
    assert cues_of(ffai(env, "caption", "-i", str(still), *flags)) == [(0.0, 0.0, "a green picture")]


def test_a_window_the_engine_refuses_is_one_line_before_any_work(plugin, tmp_path):
    env, model = plugin
    out = tmp_path / "x.srt"
    args = ["caption", "-i", str(DEMO_CLIP), "--engine", "palette", "--model", str(model), "--window", "9"]
    done = ffai(env, *args, "-o", str(out))
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().strip().splitlines() == [
        "ffai: error: --window 9: the palette model takes at most 8 frames"
    ]
    assert not out.exists()


def test_the_inline_runner_chains_the_same_stages(tmp_path):
    model = InlineEngine(ENGINE, write_checkpoint(tmp_path / "model"))
    assert list(model.stages) == ["look", "say"]
    red, blue = Image.new("RGB", (8, 8), (230, 20, 20)), Image.new("RGB", (8, 8), (50, 40, 120))
    answer = model(Request.frames([red, blue], [4.0, 4.5], DecodingOptions(), span=(4.0, 5.0)))
    assert (answer.text, answer.token_ids) == ("red, blue from 4 s to 5 s", (0, 1))
    pieces: list[str] = []
    assert model(Request((blue,), DecodingOptions()), on_text=pieces.append).text == "a blue picture"
    assert pieces == ["a blue picture"]
    assert model.through(Request((red,), DecodingOptions()), "look").colours == (0,)


def test_a_live_source(plugin):
    env, model = plugin
    scenes = demo_scenes.CLIP_SCENES[:2]
    stream = encode_ts(scenes, 2.0)
    args = ["-i", "-", "--engine", "palette", "--model", str(model), "--fps", "1", "--window", "2"]
    cues = cues_of(ffai(env, "caption", *args, "-f", "jsonl", "-o", "-", stdin=stream))
    assert [(start, end) for start, end, _ in cues] == [(0.0, 2.0), (2.0, 4.0)]
    assert [text for *_, text in cues] == ["blue, blue from 0 s to 2 s", "black, black from 2 s to 4 s"]


@pytest.mark.ray
@pytest.mark.slow
def test_a_local_ray_cluster(plugin, tmp_path):
    pytest.importorskip("ray")
    env, model = plugin
    args = ["-i", str(DEMO_CLIP), "--engine", "palette", "--model", str(model), "--fps", "1", "--window", "3"]
    done = ffai(env, "caption", *args, "--ray", "local", "-o", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert cues_in((tmp_path / "out.jsonl").read_text()) == expected_clip_cues()


@pytest.mark.slow
def test_bench_vlm_runs_the_engine_against_its_own_reference(plugin, tmp_path):
    """``ffai bench vlm --engine palette``: the reference arm, the checkpoint and the probes come
    from the engine's bench hooks (minimal_engine.BENCH), with no edit to the bench.

    Checked: the correctness gate (tokens identical, one palette token per picture, which only
    the palette's own reference gives), the precision run's floor from the engine's weights and,
    in int8, the agreement gate from its probes. Not checked: the speed and footprint gates and
    the decode time per token; a toy engine's pipeline processes against a numpy mean say
    nothing about either (the palette says every word at once: no decode steps to time)."""
    env, model = plugin
    flags = ["--engine", "palette", "--repeats", "1", "--cores", "1", "--json", "--no-fail", "-q"]
    flags += ["--ledger", str(tmp_path / "ledger.jsonl")]
    # No --model: the bench's default checkpoint, written by the engine's hook into the cache.
    # The frame case runs in the int8 bench below: each case is three fresh processes.
    done = ffai(env, "bench", "vlm", *flags, "--cases", "window,clip")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert report["engine"] == "palette" and Path(report["model"]).name.startswith("palette-tiny-")
    assert json.loads((Path(report["model"]) / "config.json").read_text())["colours"] == COLOURS
    assert report["gates"]["correctness"] == {"status": "PASS", "detail": "tokens identical in 7 items"}
    assert report["gates"]["quality"]["status"] == "SKIP"
    # A window of 8 frames, the clip's 6 windows of 2: one token per picture, not 32.
    totals = [(r["case"], r["tokens"]["items"], r["tokens"]["total"]) for r in report["cases"]]
    assert totals == [("window", 1, 8), ("clip", 6, 12)]
    for record in report["cases"]:
        assert record["tokens"]["equal"] and not record["ffai_imports_transformers"]
        assert record["reference"]["torch_threads"] == {}  # numpy's mean, not transformers
        assert record["precision"]["floor_bytes"] == 3 * len(COLOURS) * 4  # the palette, in float32
        assert record["precision"]["decode_ms_per_token"] is None

    # The reference arm alone: the palette's own, on its own checkpoint.
    arm = [sys.executable, "-m", "ffai.bench.arms", "reference", "window", "--engine", "palette", "--model", str(model)]
    done = subprocess.run(arm, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["implementation"] == "numpy mean colour" and len(result["tokens"]["window"]) == 8

    # int8: the agreement gate from the engine's probes (features, prefill logits, float32 tokens).
    done = ffai(env, "bench", "vlm", *flags, "--model", str(model), "--cases", "frame", "--dtype", "int8")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert report["gates"]["agreement"]["status"] == "PASS", report["gates"]["agreement"]
    (record,) = report["cases"]
    assert (record["case"], record["tokens"]["items"], record["tokens"]["total"]) == ("frame", 1, 1)
    precision = record["precision"]
    assert precision["float32_is_reference"] and precision["tiles"] == 1
    assert precision["tile_cosine_min"] == pytest.approx(1.0) and precision["logits_cosine_min"] == pytest.approx(1.0)
