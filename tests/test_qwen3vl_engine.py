"""The qwen3-vl engine through ffai's front door: registered beside smolvlm, `ffai caption` on a
window (as video) and a still equal to transformers' answer on the same input presented the same
way, the pixel budgets, and every bad input refused in one line before weights load.

The checkpoint is the tiny random-weight one ``ffai.engines.qwen3vl.bench.checkpoints`` writes with
transformers (cached); the real 2B shapes are measured by hand (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from ffai.bench import checkpoints
from ffai.bench.writer import release_references
from ffai.cli import run
from ffai.engines import registry
from ffai.engines.contract import DecodingOptions
from ffai.engines.qwen3vl.bench.checkpoints import WRITER
from ffai.engines.qwen3vl.bench.reference import reference_inputs
from ffai.engines.qwen3vl.engine import ENGINE, frame_budget_factor, processor_config
from ffai.engines.qwen3vl.preprocess import PREPROCESSOR_FILE
from ffai.engines.qwen3vl.video_frames import video_grid
from ffai.errors import ModelError, UsageError

ROOT = Path(__file__).resolve().parent.parent
DEMO_CLIP = ROOT / "examples" / "demo_clip.mp4"  # 12 s, 128x96
SMALL_FILES = (
    "config.json",
    "generation_config.json",
    PREPROCESSOR_FILE,
    "video_preprocessor_config.json",
    "chat_template.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
TOKENS = 12


@pytest.fixture(scope="module")
def still(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("media") / "still.png"
    Image.effect_mandelbrot((211, 137), (-2, -1.2, 1, 1.2), 60).convert("RGB").save(path)
    return path


def caption(capsys, *args: str) -> tuple[int, str, str]:
    code = run(["caption", *args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ffai: error:") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], err
    return lines[0]


def reference_answer(model_dir: Path, images, times, span, options: DecodingOptions) -> str:
    """transformers' greedy answer to what ffai asks, as the bench's reference arm asks it."""
    import torch

    processor = WRITER.reference_processor(model_dir)
    inputs = reference_inputs(processor, model_dir, images, times, span, options)
    with torch.inference_mode():
        out = WRITER.reference_model(model_dir).generate(
            **inputs, max_new_tokens=options.max_new_tokens, do_sample=False
        )
    return processor.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_engines_lists_both(capsys):
    assert run(["engines", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"smolvlm", "qwen3-vl"} <= set(rows)
    assert rows["qwen3-vl"]["status"] == "experimental"
    assert rows["qwen3-vl"]["default_model"] == "qwen3-vl-2b-instruct"


def test_models_list_says_decoding_is_greedy(capsys):
    assert run(["models", "list"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "qwen3-vl-2b-instruct" in out and "qwen3-vl-4b-instruct" in out
    assert "decodes greedily by default, even where its generation_config.json asks for sampling" in out


def test_a_manifest_or_a_folders_config_picks_the_engine(qwen3vl_tiny):
    assert registry.engine_for_model(None, str(qwen3vl_tiny)).info.name == "qwen3-vl"
    assert (
        registry.engine_for_model(None, str(ROOT / "ffai" / "models" / "bundled" / "smolvlm-demo")).info.name
        == "smolvlm"
    )
    assert registry.engine_for_model(None, "qwen3-vl-4b-instruct").info.name == "qwen3-vl"
    assert registry.engine_for_model(None, "smolvlm-demo").info.name == "smolvlm"
    with pytest.raises(ModelError, match=r"qwen3-vl-2b-instruct\.toml: .*--engine qwen3-vl"):
        registry.engine_for_model("smolvlm", "qwen3-vl-2b-instruct")


@pytest.mark.oracle
def test_window_as_video_equals_reference(capsys, tmp_path, qwen3vl_tiny):
    """One 8-frame window at 2 fps, its frames held to a budget below their size: the track's
    text is transformers' answer on the same frames, times and budget."""
    from ffai import media

    out = tmp_path / "out.json"
    flags = ["--fps", "2", "--window", "8", "-t", "4", "--max-new-tokens", str(TOKENS), "--frame-max-pixels", "6000"]
    code, _, err = caption(
        capsys, "--engine", "qwen3-vl", "--model", str(qwen3vl_tiny), "-i", str(DEMO_CLIP), *flags, "-o", str(out)
    )
    assert code == 0, err
    (cue,) = json.loads(out.read_text(encoding="utf-8"))["cues"]
    frames = list(media.Decoder(isolated=False).sample_frames(DEMO_CLIP, 2.0, duration=4.0))
    assert [f.time for f in frames] == cue["frame_times"]
    options = DecodingOptions(max_new_tokens=TOKENS, frame_max_pixels=6000)
    expected = reference_answer(
        qwen3vl_tiny, [f.image for f in frames], cue["frame_times"], (cue["start"], cue["end"]), options
    )
    assert cue["text"] == expected.strip() and cue["text"]


@pytest.mark.oracle
def test_still_equals_reference(capsys, qwen3vl_tiny, still):
    code, out, err = caption(
        capsys, "--model", str(qwen3vl_tiny), "--engine", "qwen3-vl", "-i", str(still), "--max-new-tokens", str(TOKENS),
        "--min-pixels", "4096", "--max-pixels", "20000",
    )  # fmt: skip
    assert code == 0, err
    options = DecodingOptions(max_new_tokens=TOKENS, min_pixels=4096, max_pixels=20000)
    with Image.open(still) as image:
        expected = reference_answer(qwen3vl_tiny, [image.convert("RGB")], None, None, options)
    assert out.strip() == expected.strip() and expected.strip()


def test_compile_asked_of_qwen3vl_is_one_warning_and_the_same_answer(capsys, qwen3vl_tiny, still):
    """The kit's compiled step does not normalise q and k per head, as Qwen3's tower does: ``--compile``
    says so once and the int8 answer is the eager one."""
    args = ["--model", str(qwen3vl_tiny), "-i", str(still), "--max-new-tokens", str(TOKENS), "--dtype", "int8"]
    code, eager, err = caption(capsys, *args)
    assert code == 0, err
    code, compiled, err = caption(capsys, *args, "--compile")
    assert code == 0 and compiled == eager and eager.strip()
    assert [line for line in err.splitlines() if "--compile" in line] == [
        "ffai: warning: --compile: this text tower normalises q and k per head, which the compiled step does "
        "not; the int8 decode step runs uncompiled"
    ], err


@pytest.mark.parametrize("frames", [1, 2, 3, 5, 8])
def test_a_frame_budget_bounds_each_frame(qwen3vl_tiny, frames):
    """The frame budgets are each frame's, whatever the window's frame count: a large frame
    shrinks to at most --frame-max-pixels, a small one grows to about --frame-min-pixels (within
    the processor's rounding of odd counts: ``frame_budget_factor``)."""
    options = DecodingOptions(frame_min_pixels=10_000, frame_max_pixels=50_000)
    cfg = processor_config(qwen3vl_tiny, options, frames)
    scale = frame_budget_factor(frames, cfg.temporal_patch_size)
    assert (cfg.video.min_pixels, cfg.video.max_pixels) == (10_000 * scale, 50_000 * scale)
    area = {}
    for height, width in ((1080, 1920), (45, 80)):
        _, rows, cols = video_grid(frames, height, width, cfg)
        area[height] = rows * cols * cfg.patch_size**2
    assert 25_000 <= area[1080] <= 50_000 and 7_500 <= area[45] <= 20_000, area


def edited_copy(tmp_path: Path, qwen3vl_tiny: Path, edit=None, name: str = "config.json") -> Path:
    """The tiny checkpoint's folder again (its weights linked), with one small file edited."""
    folder = tmp_path / "model"
    folder.mkdir()
    for f in SMALL_FILES:
        shutil.copy(qwen3vl_tiny / f, folder / f)
    (folder / "model.safetensors").symlink_to(qwen3vl_tiny / "model.safetensors")
    if edit is not None:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
        edit(data)
        (folder / name).write_text(json.dumps(data), encoding="utf-8")
    return folder


def drop_video_pad(tokenizer: dict) -> None:
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] != "<|video_pad|>"]
    tokenizer["model"]["vocab"].pop("<|video_pad|>", None)


def shrink_context(config: dict) -> None:
    config["text_config"]["max_position_embeddings"] = 300


def index_of_missing_shard(tmp_path: Path, qwen3vl_tiny: Path) -> Path:
    from safetensors import safe_open

    folder = edited_copy(tmp_path, qwen3vl_tiny)
    (folder / "model.safetensors").unlink()
    with safe_open(str(qwen3vl_tiny / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names[:-1]}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    (folder / "model-00001-of-00002.safetensors").symlink_to(qwen3vl_tiny / "model.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "case, code, fragments",
    [
        ("missing shard", 1, ["model-00002-of-00002.safetensors: shard missing"]),
        ("no weights", 1, ["no model.safetensors and no model.safetensors.index.json"]),
        ("tokenizer without video pad", 1, ["tokenizer.json: missing token <|video_pad|>"]),
        ("smolvlm folder", 1, ["config.json: ", "model_type 'idefics3'"]),
        ("window too long", 2, ["--window 8:", "context of 300 tokens", "--frame-max-pixels"]),
        ("window as images", 2, ["--window-as images: the qwen3-vl engine shows a window as one video"]),
        ("still budget upside down", 2, ["--min-pixels/--max-pixels", PREPROCESSOR_FILE]),
    ],
)
def test_bad_input_is_one_line_before_weights_load(capsys, tmp_path, qwen3vl_tiny, case, code, fragments):
    flags: list[str] = []
    if case == "missing shard":
        model = index_of_missing_shard(tmp_path, qwen3vl_tiny)
    elif case == "no weights":
        model = edited_copy(tmp_path, qwen3vl_tiny)
        (model / "model.safetensors").unlink()
    elif case == "tokenizer without video pad":
        model = edited_copy(tmp_path, qwen3vl_tiny, drop_video_pad, "tokenizer.json")
    elif case == "smolvlm folder":
        model = ROOT / "ffai" / "models" / "bundled" / "smolvlm-demo"
    elif case == "window too long":
        model = edited_copy(tmp_path, qwen3vl_tiny, shrink_context)
    elif case == "window as images":
        model, flags = qwen3vl_tiny, ["--window-as", "images"]
    else:
        model, flags = qwen3vl_tiny, ["--max-pixels", "1000"]  # under the checkpoint's minimum for a still
    out = tmp_path / "out.srt"
    args = ["--engine", "qwen3-vl", "--model", str(model), "-i", str(DEMO_CLIP), *flags, "-o", str(out)]
    got, _, err = caption(capsys, *args)
    assert got == code, err
    one_error_line(err, *fragments)
    assert not out.exists()


def test_smolvlm_refuses_a_pixel_budget(capsys, tmp_path):
    code, _, err = caption(
        capsys, "--model", str(ROOT / "ffai" / "models" / "bundled" / "smolvlm-demo"), "-i", str(DEMO_CLIP), "--max-pixels", "90000",
        "-o", str(tmp_path / "out.srt"),
    )  # fmt: skip
    assert code == 2
    one_error_line(err, "--max-pixels: the smolvlm engine takes no pixel budget", "longest edge")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_pixels": 0}, "--max-pixels must be at least 1"),
        ({"frame_min_pixels": 9, "frame_max_pixels": 8}, "--frame-min-pixels 9 is more than --frame-max-pixels 8"),
    ],
)
def test_pixel_budgets_are_validated_once(kwargs, message):
    with pytest.raises(UsageError, match=message):
        DecodingOptions(**kwargs)


def test_int8_captions_a_still(capsys, tmp_path, qwen3vl_tiny, still):
    """--dtype int8 runs (ffai.engines.qwen3vl.precision's plan; its agreement: tests/test_qwen3vl_precision.py)."""
    out = tmp_path / "out.txt"
    code, _, err = caption(
        capsys,
        "--engine",
        "qwen3-vl",
        "--model",
        str(qwen3vl_tiny),
        "-i",
        str(still),
        "--dtype",
        "int8",
        "--max-new-tokens",
        "8",
        "-o",
        str(out),
    )
    assert code == 0, err
    assert out.read_text(encoding="utf-8").strip()


def test_check_window_passes_a_whole_checkpoint(qwen3vl_tiny):
    ENGINE.check_window(qwen3vl_tiny, 8, DecodingOptions(frame_max_pixels=100_000))


def test_check_window_bounds_thin_frames(tmp_path, qwen3vl_tiny):
    # Under a small frame budget a thin frame makes more tokens than the largest square one: the
    # check must bound every frame shape, so a context one token short of the thin window refuses it.
    from ffai.engines.qwen3vl.engine import WIDEST_TIME, prompt_text
    from ffai.engines.qwen3vl.prompt import PromptBuilder

    options = DecodingOptions(frame_max_pixels=4096, max_new_tokens=1)
    cfg = processor_config(qwen3vl_tiny, options, 8)
    text = prompt_text(options, still=False)
    thin = PromptBuilder.from_dir(qwen3vl_tiny).count_tokens(8, 8192, 41, text, [WIDEST_TIME] * 8, cfg)
    folder = tmp_path / "short-context"
    folder.mkdir()
    for path in qwen3vl_tiny.iterdir():
        (folder / path.name).symlink_to(path)
    config = json.loads((qwen3vl_tiny / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = thin
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="--window 8"):
        ENGINE.check_window(folder, 8, options)


@pytest.mark.real
@pytest.mark.oracle
@pytest.mark.skipif(
    not os.environ.get("FFAI_QWEN3VL_2B"), reason="the 2B shapes take ~8.5 GB and minutes: set FFAI_QWEN3VL_2B=1"
)
def test_cli_text_equals_reference_at_2b_shapes(capsys, tmp_path, still):
    """`ffai caption` on Qwen3-VL-2B's shapes (random weights): a 4-frame window and a still, 32
    tokens each, the track's text transformers' decode. One model in memory at a time."""
    import gc

    from ffai import media

    model = checkpoints.checkpoint("2b", "qwen3-vl")
    options = DecodingOptions(max_new_tokens=32)
    window = tmp_path / "window.json"
    flags = ["--engine", "qwen3-vl", "--model", str(model), "--max-new-tokens", "32"]
    code, _, err = caption(
        capsys, *flags, "-i", str(DEMO_CLIP), "--fps", "2", "--window", "4", "-t", "2", "-o", str(window)
    )
    assert code == 0, err
    code, still_text, err = caption(capsys, *flags, "-i", str(still))
    assert code == 0, err
    gc.collect()
    (cue,) = json.loads(window.read_text(encoding="utf-8"))["cues"]
    frames = list(media.Decoder(isolated=False).sample_frames(DEMO_CLIP, 2.0, duration=2.0))
    expected = reference_answer(
        model, [f.image for f in frames], cue["frame_times"], (cue["start"], cue["end"]), options
    )
    assert cue["text"] == expected.strip()
    with Image.open(still) as image:
        assert still_text.strip() == reference_answer(model, [image.convert("RGB")], None, None, options).strip()
    release_references()
