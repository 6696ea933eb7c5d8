"""Qwen3-VL's processor and prompt (ffai.engines.qwen3vl.preprocess, video_frames, prompt) against
transformers' ``Qwen3VLProcessor`` built from the real checkpoint's small files
(ffai/engines/qwen3vl/bench/files/qwen3-vl-2b-instruct): pixel patches bit-equal, grids and prompt ids equal, for stills
of odd sizes, modes and pixel budgets and for windows of 1, 2, 3, 8 and 64 frames shown as a clip
with their times; then the configuration's and the prompt's one-line errors, the stop ids and the
streaming decoder, which need no reference.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ffai.engines.qwen3vl.bench.checkpoints import REFERENCE_DIR as QWEN3VL_FILES
from ffai.engines.qwen3vl.preprocess import (
    PREPROCESSOR_FILE,
    VIDEO_PREPROCESSOR_FILE,
    ProcessorConfig,
    check_picture_size,
    image_size,
    pixel_values,
    preprocess_images,
)
from ffai.engines.qwen3vl.prompt import PromptBuilder
from ffai.engines.qwen3vl.video_frames import (
    clip_frames,
    pair_times,
    preprocess_video,
    video_grid,
    widest_video_tokens,
)
from ffai.errors import MediaError, ModelError, UsageError
from ffai.kit.tokenizing import TOKENIZER_FILE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QWEN_DIR = QWEN3VL_FILES
STILL_PROMPT = "Describe this image."
VIDEO_PROMPT = "Describe what happens in this video."
# A user's prompt: accents, CJK, an emoji, a newline and a control token the tokenizer splits out.
USER_PROMPT = "Décris l'image — 日本語で 🎬\nThen stop.<|im_end|>"


@pytest.fixture(scope="module")
def cfg() -> ProcessorConfig:
    return ProcessorConfig.from_dir(QWEN_DIR)


@pytest.fixture(scope="module")
def builder() -> PromptBuilder:
    return PromptBuilder.from_dir(QWEN_DIR)


@pytest.fixture(scope="module")
def processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(QWEN_DIR)


def noise(seed: int, width: int, height: int, mode: str = "RGB") -> Image.Image:
    bands = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, bands), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if bands == 1 else pixels, mode)


def chat(processor, kind: str, count: int, text: str) -> str:
    content = [{"type": kind}] * count + [{"type": "text", "text": text}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def reference_window(processor, frames, times, start: float, text: str, **videos_kwargs):
    """The reference given a window as ffai shows it (video_frames' docstring): the clip's frames
    and their times from the window's start as frame indices at 1 fps, its own sampling off."""
    from transformers.video_utils import VideoMetadata

    frames, clip_times = clip_frames(frames, times, start)
    metadata = VideoMetadata(total_num_frames=len(frames), fps=1.0, frames_indices=list(clip_times))
    return processor(
        text=chat(processor, "video", 1, text),
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        cap_pixels_per_frame=videos_kwargs.pop("cap_pixels_per_frame", False),
        return_tensors="pt",
        **videos_kwargs,
    )


# (width, height, mode, image_min, image_max): odd sizes and aspects at the checkpoint's budget,
# then small overrides that make one picture grow to the minimum and one shrink to the maximum.
STILLS = [
    (33, 17, "RGB", None, None),  # under the minimum: scaled up
    (640, 360, "RGB", None, None),
    (1000, 1001, "RGB", None, None),
    (45, 1400, "RGB", None, None),  # tall, 31:1
    (400, 2, "RGB", None, None),  # at the 200:1 limit, its short side rounded to nothing first
    (301, 97, "RGBA", None, None),  # transparency composited onto white
    (123, 77, "L", None, None),
    (200, 150, "RGB", 300 * 300, None),  # hits a raised minimum
    (1000, 1001, "RGB", 32 * 32, 128 * 128),  # hits a lowered maximum
]


@pytest.mark.oracle
@pytest.mark.parametrize(
    "width, height, mode, image_min, image_max", STILLS, ids=[f"{s[0]}x{s[1]}-{s[2]}-{s[4] or 'max'}" for s in STILLS]
)
def test_still_equals_reference(processor, cfg, builder, width, height, mode, image_min, image_max):
    image = noise(width * height, width, height, mode)
    cfg = cfg.with_pixels(image_min=image_min, image_max=image_max)
    size = {"shortest_edge": cfg.image.min_pixels, "longest_edge": cfg.image.max_pixels}
    pictures = preprocess_images([image], cfg)
    for text in (STILL_PROMPT, USER_PROMPT):
        ref = processor(text=chat(processor, "image", 1, text), images=[image], size=size, return_tensors="pt")
        assert builder.build_images(pictures.grids, text, cfg) == ref["input_ids"][0].tolist()
    assert torch.equal(pictures.grid_thw, ref["image_grid_thw"])
    assert pictures.frames[0].dtype == torch.uint8
    assert torch.equal(pixel_values(pictures, cfg), ref["pixel_values"])


@pytest.mark.oracle
def test_stills_of_one_prompt_equal_reference(processor, cfg, builder):
    """Two stills of one size are resized together by the reference, a third apart: the same bytes."""
    images = [noise(1, 90, 70), noise(2, 90, 70), noise(3, 50, 260)]
    ref = processor(text=chat(processor, "image", 3, STILL_PROMPT), images=images, return_tensors="pt")
    pictures = preprocess_images(images, cfg)
    assert torch.equal(pictures.grid_thw, ref["image_grid_thw"])
    assert torch.equal(pixel_values(pictures, cfg), ref["pixel_values"])
    assert builder.build_images(pictures.grids, STILL_PROMPT, cfg) == ref["input_ids"][0].tolist()


# (frames, width, height, first frame's time in the source, seconds between frames, video pixel
# overrides): tiny frames so 64 stay fast; times past minutes and hours so the clip's own times
# reach several digits; one clip squeezed by a small maximum, one frame size under 32 px (scaled
# up), and the processor's opt-in per-frame cap.
WINDOWS = [
    (1, 64, 48, 3725.3, 1.0, {}),
    (2, 64, 48, 61.7, 0.5, {}),
    (3, 64, 48, 12.0, 0.25, {}),
    (8, 64, 48, 3600.25, 2.0, {}),
    (64, 64, 48, 7201.0, 100.0, {}),
    (8, 160, 90, 0.0, 0.5, {"video_max": 8 * 64 * 64}),
    (5, 20, 90, 5.0, 1.0, {}),
    (8, 160, 90, 0.0, 0.5, {"cap_pixels_per_frame": True, "video_max": 8 * 32 * 32 * 3}),
]


@pytest.mark.oracle
@pytest.mark.parametrize(
    "n, width, height, start, step, override", WINDOWS, ids=[f"{w[0]}-frames-{w[1]}x{w[2]}" for w in WINDOWS]
)
def test_window_equals_reference(processor, cfg, builder, n, width, height, start, step, override):
    override = dict(override)
    cap = override.pop("cap_pixels_per_frame", False)
    cfg = replace(cfg.with_pixels(video_max=override.get("video_max")), cap_pixels_per_frame=cap)
    size = {"shortest_edge": cfg.video.min_pixels, "longest_edge": cfg.video.max_pixels}
    frames = [noise(100 + i, width, height) for i in range(n)]
    times = [start + i * step for i in range(n)]
    clip, clip_times = clip_frames(frames, times, start)
    pictures = preprocess_video(clip, cfg)
    for text in (VIDEO_PROMPT, USER_PROMPT):
        ref = reference_window(processor, frames, times, start, text, size=size, cap_pixels_per_frame=cap)
        ids = builder.build_video(pictures.grids[0], clip_times, text, cfg)
        assert ids == ref["input_ids"][0].tolist()
        assert builder.count_tokens(n, height, width, text, [t - start for t in times], cfg) == len(ids)
    assert torch.equal(pictures.grid_thw, ref["video_grid_thw"])
    assert pictures.grids[0] == video_grid(n, height, width, cfg)
    assert torch.equal(pixel_values(pictures, cfg), ref["pixel_values_videos"])


def test_window_prompt_times(cfg, builder):
    """The clip starts at 0 s; each pair is at the mean of its frames, a padded copy at the last."""
    times = [3600.25 + 0.5 * i for i in range(3)]
    clip, clip_times = clip_frames([noise(i, 64, 48) for i in range(3)], times, 3600.25)
    assert len(clip) == 3 and clip_times == [0.0, 0.5, 1.0]
    assert pair_times(clip_times, 2) == [0.25, 1.0]
    pictures = preprocess_video(clip, cfg)
    text = builder.decode(builder.build_video(pictures.grids[0], clip_times, "Go.", cfg))
    assert "<0.2 seconds>" in text and "<1.0 seconds>" in text  # 0.25 is written as Python rounds it
    lone, lone_times = clip_frames([clip[0]], [7.5], 7.0)
    assert lone == [clip[0], clip[0]] and lone_times == [0.5, 0.5]


def test_config_reads_both_files(cfg):
    assert (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size, cfg.factor) == (16, 2, 2, 32)
    assert (cfg.image.min_pixels, cfg.image.max_pixels) == (65536, 16777216)
    assert (cfg.video.min_pixels, cfg.video.max_pixels) == (4096, 25165824)
    assert cfg.patch_dim == 1536 and not cfg.cap_pixels_per_frame
    assert cfg.tokens((2, 4, 6)) == 12
    with pytest.raises(UsageError, match="minimum"):
        cfg.with_pixels(image_min=70000, image_max=60000)
    with pytest.raises(UsageError, match="video pixels"):
        cfg.with_pixels(video_min=0)


def edit_copy(tmp_path: Path, name: str, edit) -> Path:
    """A copy of the checkpoint's small files with ``name``'s JSON passed through ``edit``."""
    folder = tmp_path / "ckpt"
    shutil.copytree(QWEN_DIR, folder)
    path = folder / name
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return folder


@pytest.mark.parametrize(
    "name, edit, message",
    [
        (PREPROCESSOR_FILE, lambda d: {k: v for k, v in d.items() if k != "patch_size"}, "missing key 'patch_size'"),
        (PREPROCESSOR_FILE, lambda d: {**d, "image_processor_type": "SiglipImageProcessor"}, "image_processor_type"),
        (PREPROCESSOR_FILE, lambda d: {**d, "do_normalize": False}, "do_normalize must be true"),
        (PREPROCESSOR_FILE, lambda d: {**d, "resample": 2}, "resample 2"),
        (PREPROCESSOR_FILE, lambda d: {**d, "size": {"longest_edge": 100}}, "size.shortest_edge"),
        (PREPROCESSOR_FILE, lambda d: {**d, "image_mean": [0.5, 0.5]}, "image_mean must be 3 numbers"),
        (VIDEO_PREPROCESSOR_FILE, lambda d: {**d, "merge_size": 4}, "merge_size 4 differs"),
        (VIDEO_PREPROCESSOR_FILE, lambda d: {**d, "image_std": [0.3, 0.3, 0.3]}, "image_std differs"),
        (VIDEO_PREPROCESSOR_FILE, lambda d: [d], "must be a JSON object"),
    ],
)
def test_config_errors_name_the_file(tmp_path, name, edit, message):
    folder = edit_copy(tmp_path, name, edit)
    with pytest.raises(ModelError, match=message) as caught:
        ProcessorConfig.from_dir(folder)
    assert str(caught.value).startswith(str(folder / name)) and "\n" not in str(caught.value)


def test_config_missing_file(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(QWEN_DIR, folder)
    (folder / VIDEO_PREPROCESSOR_FILE).unlink()
    with pytest.raises(ModelError, match=f"no {VIDEO_PREPROCESSOR_FILE} in the model folder"):
        ProcessorConfig.from_dir(folder)


def test_pictures_refused_in_one_line(cfg):
    with pytest.raises(MediaError, match="aspect ratios up to 200:1"):
        image_size(2, 500, cfg)
    with pytest.raises(MediaError, match="each side must be"):
        check_picture_size(0, 10)
    with pytest.raises(MediaError, match="differ in size"):
        preprocess_video([noise(1, 64, 48), noise(2, 48, 64)], cfg)


def test_tokenizer_without_vision_tokens(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    folder = tmp_path / "ckpt"
    shutil.copytree(QWEN_DIR, folder)
    # A small tokenizer (the real one takes seconds to rewrite) with every special token but one.
    vocab = {token: i for i, token in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", "<|image_pad|>"])}
    vocab.update({"<|vision_start|>": 4, "<|vision_end|>": 5})
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(folder / TOKENIZER_FILE))
    with pytest.raises(ModelError, match=r"missing token <\|video_pad\|> \(not a Qwen3-VL tokenizer\)") as caught:
        PromptBuilder.load(folder)
    assert str(caught.value).startswith(str(folder / TOKENIZER_FILE))


def test_prompt_refuses_placeholders(cfg, builder):
    for token in ("<|image_pad|>", "<|video_pad|>"):
        with pytest.raises(UsageError, match="must not contain"):
            builder.build_images([(1, 4, 4)], f"what is {token}?", cfg)


def test_stop_ids(builder):
    # generation_config.json's eos ids: <|im_end|>, then <|endoftext|>
    assert builder.stop_ids() == (151645, 151643)
    assert builder.im_end_id == 151645 and builder.video_token_id == 151656


def test_text_stream_adds_up_to_decode(builder):
    """Multi-byte characters split across byte-level tokens: pieces are final and add up."""
    text = "Un café 日本語 🎬🎬 done."
    ids = builder.encode(text)
    assert len(ids) > len(text.split())  # some characters span several tokens
    stream = builder.text_stream()
    pieces = [stream.step(i) for i in ids]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) + stream.finish() == builder.decode(ids) == text


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 64, 300])
def test_widest_window_bounds_every_frame_size(cfg, builder, n):
    """The window check's bound, before frames are seen, holds at any frame size: common ones,
    the extremes of size and aspect, and random ones; and at a small maximum and with the cap."""
    rng = np.random.default_rng(n)
    sizes = [(1, 1), (1, 200), (200, 1), (3, 599), (8192, 8192), (8192, 41), (1080, 1920), (2160, 3840), (48, 64)]
    sizes += [tuple(int(v) for v in rng.integers(1, 4000, 2)) for _ in range(200)]
    sizes = [(h, w) for h, w in sizes if max(h, w) / min(h, w) <= 200]
    for config in (cfg, cfg.with_pixels(video_max=8 * 64 * 64), replace(cfg, cap_pixels_per_frame=True)):
        bound = widest_video_tokens(n, config)
        worst = 0
        for height, width in sizes:
            try:
                worst = max(worst, config.tokens(video_grid(n, height, width, config)))
            except MediaError:  # a thin frame scaled up past 200:1
                continue
        assert worst <= bound
    times = [35999.9] * n
    assert builder.count_widest(n, VIDEO_PROMPT, 35999.9, cfg) >= builder.count_tokens(
        n, 2160, 3840, VIDEO_PROMPT, times, cfg
    )
