"""The bundled demo checkpoint (models/smolvlm-demo): it captions held-out synthetic scenes
through the engine, ``ffai caption`` on the bundled clip gives each scene's caption in its
time range, and its manifest pins the shipped files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ffai.bench import demo_eval, demo_scenes

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "smolvlm-demo"
CLIP = REPO / "models" / "demo_clip.mp4"
MANIFEST = REPO / "models" / "smolvlm-demo.toml"
DOC_FILE = "RECIPE.md"
MAX_FOLDER_BYTES = 20 * 2**20
MAX_CLIP_BYTES = 2**20


@pytest.fixture(scope="module")
def demo_model():
    from ffai.engine import RuntimeOptions
    from ffai_smolvlm import ENGINE

    return ENGINE.load(DEMO, RuntimeOptions(device="cpu"))


def test_heldout_scenes_are_unseen_geometry():
    train = demo_scenes.scenes("train", 400, seed=0)
    heldout = demo_scenes.scenes("heldout", 200, seed=0)
    train_cells = {demo_scenes.geometry_cell(s) for s in train}
    heldout_cells = {demo_scenes.geometry_cell(s) for s in heldout}
    assert not train_cells & heldout_cells
    # Same label space, both kinds of motion, and the draw is reproducible.
    assert {demo_scenes.caption(s) for s in heldout} <= set(demo_scenes.all_captions())
    assert any(s.moving for s in heldout) and any(not s.moving for s in heldout)
    assert demo_scenes.scenes("heldout", 200, seed=0) == heldout
    assert demo_scenes.scenes("heldout", 200, seed=1) != heldout


def test_heldout_accuracy_through_the_engine(demo_model):
    result = demo_eval.evaluate(DEMO, n=40, seed=7, model=demo_model)
    assert result.total == 40
    assert {"still", "window"} <= set(result.by_kind)
    wrong = [(item.kind, text) for item, text in result.failures]
    assert result.accuracy >= 0.9, wrong


def _caption_clip(tmp_path, fps: str, window: str) -> list[dict]:
    """``ffai caption`` on the bundled clip with no --model: the bundled demo model is the default
    when the real model is not found (FFAI_HOME points at an empty folder)."""
    out = tmp_path / f"out-{fps}-{window}.json"
    env = {**os.environ, "FFAI_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    env.pop("FFAI_MODEL", None)
    args = ["caption", "-i", str(CLIP), "--fps", fps, "--window", window, "-o", str(out)]
    proc = subprocess.run([sys.executable, "-m", "ffai", *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "using the small bundled demo model smolvlm-demo" in proc.stderr
    return json.loads(out.read_text(encoding="utf-8"))["cues"]


def test_demo_clip_track_has_each_scene_caption_in_its_time_range(tmp_path):
    # --fps 2 --window 6: one 3 s window per scene, as in the README.
    seconds = demo_scenes.CLIP_SECONDS_PER_SCENE
    cues = _caption_clip(tmp_path, "2", "6")
    expected = [(k * seconds, (k + 1) * seconds, demo_scenes.caption(s)) for k, s in enumerate(demo_scenes.CLIP_SCENES)]
    assert [(c["start"], c["end"], c["text"]) for c in cues] == expected


def test_demo_clip_windows_inside_one_scene_get_its_caption(tmp_path):
    # --fps 2 --window 4: 2 s windows, some straddling a cut (those may blend the two scenes).
    seconds = demo_scenes.CLIP_SECONDS_PER_SCENE
    cues = _caption_clip(tmp_path, "2", "4")
    assert cues and cues[-1]["end"] == pytest.approx(len(demo_scenes.CLIP_SCENES) * seconds)
    pure = {}
    for cue in cues:
        first, last = int(cue["start"] // seconds), int((cue["end"] - 1e-6) // seconds)
        if first == last:
            pure[first] = cue["text"]
            assert cue["text"] == demo_scenes.caption(demo_scenes.CLIP_SCENES[first]), cue
    assert set(pure) == set(range(len(demo_scenes.CLIP_SCENES)))  # every scene has a window of its own


def test_manifest_pins_the_shipped_files():
    from ffai.models import Manifest

    manifest = Manifest.from_toml(MANIFEST)
    assert (manifest.name, manifest.engine, manifest.hf_repo) == ("smolvlm-demo", "smolvlm", "")
    shipped = {p.name for p in DEMO.iterdir()} - {DOC_FILE}
    assert {f.path for f in manifest.files} == shipped
    for f in manifest.files:
        data = (DEMO / f.path).read_bytes()
        assert len(data) == f.size, f.path
        assert hashlib.sha256(data).hexdigest() == f.sha256, f.path
    assert sum(p.stat().st_size for p in DEMO.iterdir()) <= MAX_FOLDER_BYTES
    assert CLIP.stat().st_size <= MAX_CLIP_BYTES
