"""The kit serves a family ffai has never seen: the toy engine (tests/toy_engine.py), its
architecture alone (a patch projection, a prompt template, weight names) over the kit's text
tower, token loop, loading and stages, registered through the ``ffai.engines`` entry point and
run by ``ffai caption`` end to end: a clip's windows and a still, in float32 and int8, the same
answers as the library's inline runner gives. (The palette engine, tests/minimal_engine.py, proves
the contract; this one proves the kit.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import toy_engine
from ffai.engines.contract import DecodingOptions, Request, RuntimeOptions
from ffai.run.inline import InlineEngine
from live_sources import ffai_env
from minimal_engine import register_engine

DEMO_CLIP = Path(__file__).resolve().parents[1] / "examples" / "demo_clip.mp4"


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(environment with the toy engine registered, its random-weight checkpoint)."""
    folder = tmp_path_factory.mktemp("toy")
    env = ffai_env(register_engine(folder / "plugins", toy_engine.NAME, "toy_engine:ENGINE"))
    return env, toy_engine.write_checkpoint(folder / "model")


def ffai(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ffai", *args], env=env, capture_output=True, text=True, timeout=300)


def cues(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr
    return [r for r in map(json.loads, done.stdout.splitlines()) if "index" in r]


def test_the_toy_engine_is_listed(toy):
    env, _ = toy
    listed = json.loads(ffai(env, "engines", "--json").stdout)
    assert {"toy", "smolvlm", "qwen3-vl"} <= {e["name"] for e in listed}


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_caption_a_clip_and_a_still_as_the_library_does(toy, tmp_path, dtype):
    env, model = toy
    common = ["--engine", "toy", "--model", str(model), "--dtype", dtype, "--max-new-tokens", "6", "-f", "jsonl"]
    clip = cues(ffai(env, "caption", "-i", str(DEMO_CLIP), "--fps", "1", "--window", "3", *common, "-o", "-"))
    assert [(c["start"], c["end"]) for c in clip] == [(0.0, 3.0), (3.0, 6.0), (6.0, 9.0), (9.0, 12.0)]
    still = tmp_path / "still.png"
    Image.new("RGB", (40, 30), (200, 30, 30)).save(still)
    (one,) = cues(ffai(env, "caption", "-i", str(still), *common, "-o", "-"))
    assert one["text"]
    # The same request through the inline runner (the library's): the same answer.
    inline = InlineEngine(toy_engine.ENGINE, model, RuntimeOptions(dtype=dtype, device="cpu"))
    options = DecodingOptions(max_new_tokens=6)
    with Image.open(still) as image:
        answer = inline(Request((image.convert("RGB"),), options))
    assert answer.token_ids and answer.text.strip() == one["text"]


def test_the_toy_engine_holds_its_architecture_only():
    """It imports the kit and the contract, never another engine, and stays small: its module is
    the cost of the next family (a third family written on the kit)."""
    source = Path(toy_engine.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in imported if m.startswith("ffai.")} <= {
        "ffai.engines.contract",
        "ffai.errors",
        *(m for m in imported if m.startswith("ffai.kit.")),
    }
    code = [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) < 200, len(code)
