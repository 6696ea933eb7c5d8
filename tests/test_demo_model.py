"""The bundled demo checkpoint (models/smolvlm-demo): it captions held-out synthetic scenes of
both polarities and of non-square frames through the engine, ``ffai caption`` on the bundled
clip gives each scene's caption in its time range, and its manifest pins the shipped files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ffai.bench import demo_eval, demo_scenes

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "ffai" / "models" / "bundled" / "smolvlm-demo"
CLIP = REPO / "examples" / "demo_clip.mp4"
MANIFEST = REPO / "ffai" / "models" / "bundled" / "smolvlm-demo.toml"
DOC_FILE = "RECIPE.md"
MAX_FOLDER_BYTES = 20 * 2**20
MAX_CLIP_BYTES = 2**20
# The held-out run is 90 small requests in this process: one thread, or two spin-wait on shared cores.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def demo_model():
    from ffai.engines.contract import RuntimeOptions
    from ffai.run.inline import InlineEngine

    return InlineEngine.load("smolvlm", DEMO, RuntimeOptions(device="cpu"))


def test_heldout_scenes_are_unseen_geometry():
    train = demo_scenes.scenes("train", 400, seed=0)
    heldout = demo_scenes.scenes("heldout", 200, seed=0)
    train_cells = {demo_scenes.geometry_cell(s) for s in train}
    heldout_cells = {demo_scenes.geometry_cell(s) for s in heldout}
    assert not train_cells & heldout_cells
    # Same label space, both kinds of motion, and the draw is reproducible.
    assert {demo_scenes.caption(s) for s in heldout} <= set(demo_scenes.all_captions())
    assert any(s.moving for s in heldout) and any(not s.moving for s in heldout)
    assert {s.polarity for s in heldout} == set(demo_scenes.POLARITIES)
    assert demo_scenes.scenes("heldout", 200, seed=0) == heldout
    assert demo_scenes.scenes("heldout", 200, seed=1) != heldout


def _luma(rgb: tuple[int, int, int]) -> float:
    r, g, b = rgb
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_every_allowed_pair_has_its_polarity_with_a_clear_margin():
    # The palettes are what makes "light-on-dark" and "dark-on-light" true of every scene: each
    # shape colour is the lighter (darker) side of its edge by a brightness margin (the first
    # model's light-on-dark palette has red on dark gray at 30; the deep-on-light one is wider).
    pairs = 0
    for polarity, sign, margin in ((demo_scenes.LIGHT_ON_DARK, 1, 30), (demo_scenes.DARK_ON_LIGHT, -1, 100)):
        for colour, fill in demo_scenes.SHAPE_COLOURS[polarity].items():
            for background, ground in demo_scenes.BACKGROUND_COLOURS[polarity].items():
                if colour == background:
                    with pytest.raises(ValueError):
                        demo_scenes.Scene("circle", colour, background, 0.25, (0.5, 0.5), (0.5, 0.5), polarity)
                    continue
                assert sign * (_luma(fill) - _luma(ground)) >= margin, (polarity, colour, background)
                pairs += 1
    assert pairs == 28 + 20
    assert "a green triangle on a white background" in demo_scenes.all_captions()
    assert "a blue circle on a yellow background" in demo_scenes.all_captions()
    with pytest.raises(ValueError):  # a bright yellow shape is not in the dark-on-light palette
        demo_scenes.Scene("circle", "yellow", "white", 0.25, (0.5, 0.5), (0.5, 0.5), demo_scenes.DARK_ON_LIGHT)


def test_random_canvases_cover_portrait_to_wide():
    import random

    rng = random.Random(0)
    canvases = [demo_scenes.random_canvas(rng) for _ in range(500)]
    ratios = [w / h for w, h in canvases]
    lo, hi = demo_scenes.ASPECT
    assert all(lo * 0.95 <= r <= hi * 1.05 for r in ratios)
    assert min(ratios) < 9 / 16 and max(ratios) > 16 / 9
    assert all(max(c) <= demo_scenes.LONG_SIDE[1] for c in canvases)


def test_heldout_accuracy_through_the_engine(demo_model):
    result = demo_eval.evaluate(DEMO, n=90, seed=7, model=demo_model)
    assert result.total == 90
    assert {"still", "window"} <= set(result.by_kind)
    assert all(result.by_group[g][1] >= 30 for g in demo_eval.GROUPS), result.by_group
    assert any(item.canvas == (641, 359) for item in demo_eval.items(90, 7))
    wrong = [(item.kind, item.canvas, item.answer, text) for item, text in result.failures]
    for group in demo_eval.GROUPS:
        assert result.group_accuracy(group) >= 0.9, (group, result.by_group, wrong)


def _caption_clip(tmp_path, monkeypatch, capsys, fps: str, window: str) -> list[dict]:
    """``ffai caption`` on the bundled clip with no --model: the bundled demo model is the default
    when the real model is not found (FFAI_HOME points at an empty folder). In this process: the
    same fallback through a fresh process is test_cli's (test_unknown_model_names_pull)."""
    from ffai.cli import run

    out = tmp_path / f"out-{fps}-{window}.json"
    monkeypatch.setenv("FFAI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("FFAI_MODEL", raising=False)
    code = run(["caption", "-i", str(CLIP), "--fps", fps, "--window", window, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "using the small bundled demo model smolvlm-demo" in err
    return json.loads(out.read_text(encoding="utf-8"))["cues"]


def test_demo_clip_track_has_each_scene_caption_in_its_time_range(tmp_path, monkeypatch, capsys):
    # --fps 2 --window 6: one 3 s window per scene, as in the README.
    seconds = demo_scenes.CLIP_SECONDS_PER_SCENE
    cues = _caption_clip(tmp_path, monkeypatch, capsys, "2", "6")
    expected = [(k * seconds, (k + 1) * seconds, demo_scenes.caption(s)) for k, s in enumerate(demo_scenes.CLIP_SCENES)]
    assert [(c["start"], c["end"], c["text"]) for c in cues] == expected


def test_demo_clip_windows_inside_one_scene_get_its_caption(tmp_path, monkeypatch, capsys):
    # --fps 2 --window 4: 2 s windows, some straddling a cut (those may blend the two scenes).
    seconds = demo_scenes.CLIP_SECONDS_PER_SCENE
    cues = _caption_clip(tmp_path, monkeypatch, capsys, "2", "4")
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
