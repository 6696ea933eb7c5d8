"""SmolVLM2 checkpoints and ``--window-as`` at the edges: bad folders and windows refused in one
line before any weight loads, the option validated once and carried through every placement,
and a run record that knows it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ffai.bench import checkpoints
from ffai.engines.contract import DecodingOptions
from ffai.engines.smolvlm.bench.checkpoints import REFERENCE_DIR as SMOLVLM_FILES
from ffai.engines.smolvlm.bench.checkpoints import V2_DIR as SMOLVLM2_FILES
from ffai.engines.smolvlm.config import ModelConfig
from ffai.errors import UsageError
from test_cli import assert_one_line_error, ffai

V1_DATA = SMOLVLM_FILES
V2_DATA = SMOLVLM2_FILES


@pytest.fixture(scope="module")
def v2_tiny() -> Path:
    return checkpoints.checkpoint("v2-tiny")


def copy_with_bad_weights(source: Path, out: Path) -> Path:
    """The checkpoint's small files, and a model.safetensors that is not one: a check that gets
    past the small files would fail reading the weights instead."""
    out.mkdir()
    for path in source.iterdir():
        if path.name != "model.safetensors":
            shutil.copy(path, out / path.name)
    (out / "model.safetensors").write_bytes(b"not safetensors")
    return out


@pytest.fixture
def still(tmp_path) -> Path:
    from PIL import Image

    path = tmp_path / "still.png"
    Image.new("RGB", (32, 24), (200, 30, 40)).save(path)
    return path


def test_smolvlm2_500m_config_reads_with_the_references_defaults():
    cfg = ModelConfig.from_dir(V2_DATA)
    assert cfg.model_type == "smolvlm"
    # intermediate_size and num_hidden_layers are not in the file: Idefics3VisionConfig's defaults
    assert (cfg.vision.hidden_size, cfg.vision.intermediate_size, cfg.vision.num_layers) == (768, 3072, 12)
    assert (cfg.text.hidden_size, cfg.text.num_hidden_layers, cfg.image_seq_len) == (960, 32, 64)


def test_window_as_is_validated_once():
    assert DecodingOptions(window_as="video").window_as == "video"
    with pytest.raises(UsageError, match="--window-as must be one of video, images"):
        DecodingOptions(window_as="clip")


def test_window_as_unknown_is_one_line(still):
    assert_one_line_error(ffai("caption", "-i", str(still), "--window-as", "clip"), 2, "--window-as must be one of")


def test_video_asked_of_an_image_only_checkpoint_is_one_line_before_weights(tmp_path, still):
    folder = copy_with_bad_weights(checkpoints.checkpoint("tiny"), tmp_path / "v1")
    proc = ffai("caption", "-i", str(still), "--model", str(folder), "--window-as", "video")
    assert_one_line_error(proc, 2, "--window-as video: ")
    assert "image-only checkpoint" in proc.stderr and "--window-as images" in proc.stderr


@pytest.mark.parametrize("missing", ["tokenizer_config.json", "preprocessor_config.json", "tokenizer.json"])
def test_a_smolvlm2_folder_missing_a_file_is_one_line_naming_it(v2_tiny, tmp_path, still, missing):
    folder = copy_with_bad_weights(v2_tiny, tmp_path / "v2")
    (folder / missing).unlink()
    assert_one_line_error(ffai("caption", "-i", str(still), "--model", str(folder)), 1, f"{folder / missing}")


@pytest.mark.parametrize("name", ["tokenizer_config.json", "processor_config.json", "preprocessor_config.json"])
def test_a_smolvlm_file_beside_a_smolvlm2_config_is_one_line(v2_tiny, tmp_path, still, name):
    folder = copy_with_bad_weights(v2_tiny, tmp_path / "v2")
    mixed = json.loads((V1_DATA / name).read_text())
    if name == "preprocessor_config.json":  # keep the tiny geometry: only the generation differs
        mixed = {**json.loads((folder / name).read_text()), "processor_class": mixed["processor_class"]}
    if name == "processor_config.json":
        mixed["image_seq_len"] = json.loads((folder / name).read_text())["image_seq_len"]
    (folder / name).write_text(json.dumps(mixed))
    proc = ffai("caption", "-i", str(still), "--model", str(folder))
    assert_one_line_error(proc, 1, f"{folder / name}: processor_class 'Idefics3Processor'")
    assert "model_type 'smolvlm'" in proc.stderr and "different checkpoints" in proc.stderr


def test_a_video_window_longer_than_the_context_names_window(v2_tiny, tmp_path, still):
    folder = copy_with_bad_weights(v2_tiny, tmp_path / "v2")
    # v2-tiny: 16 image tokens and about 13 of text per frame, 8192 positions
    proc = ffai("caption", "-i", str(still), "--model", str(folder), "--window", "400")
    assert_one_line_error(proc, 2, "--window 400: 400 frames make a ")
    # As pictures the same frames take fewer tokens (no times) and fit: the run gets as far as
    # the weights, so the refusal above came before any weight loads.
    proc = ffai("caption", "-i", str(still), "--model", str(folder), "--window", "400", "--window-as", "images")
    assert_one_line_error(proc, 1, "model.safetensors")


def test_window_as_reaches_worker_processes_and_the_run_record(v2_tiny, tmp_path):
    """A clip captioned in worker processes as pictures, then as video: different prompts, so
    different answers (the option crossed into the workers); --resume names --window-as as the
    changed setting."""
    from ffai.bench import cases

    clip = cases.write_clip(tmp_path / "clip.mp4")
    common = ["caption", "-i", str(clip), "--model", str(v2_tiny), "--fps", "1", "--window", "4"]
    common += ["--max-new-tokens", "8", "--placement", "workers", "--resume"]
    texts = {}
    for how in ("images", "video"):
        out = tmp_path / f"{how}.json"
        proc = ffai(*common, "--window-as", how, "-o", str(out), timeout=300)
        assert proc.returncode == 0, proc.stderr
        texts[how] = [cue["text"] for cue in json.loads(out.read_text())["cues"]]
    assert len(texts["video"]) == len(texts["images"]) == 3 and texts["video"] != texts["images"]
    proc = ffai(*common, "--window-as", "video", "-o", str(tmp_path / "images.json"))
    assert_one_line_error(proc, 1, "(--window-as changed)")
