"""SmolVLM image preprocessing: config loading, guards, and gate 1 against transformers
(``Idefics3ImageProcessorPil``, pixel values equal with max abs diff 0)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from ffai.engines.smolvlm.bench.checkpoints import REFERENCE_DIR as SMOLVLM_FILES
from ffai.engines.smolvlm.preprocess import (
    PREPROCESSOR_FILE,
    PROCESSOR_FILE,
    ProcessorConfig,
    longest_edge_size,
    normalise,
    preprocess_images,
    tile_multiple_size,
    to_rgb,
)
from ffai.errors import MediaError, ModelError

MODEL_DIR = SMOLVLM_FILES


def noisy_gradient(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A gradient with seeded noise: smooth areas and sharp detail, so any resampling or
    rounding difference shows up in the pixels."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(height).view(-1, 1).expand(height, width)
    x = torch.arange(width).view(1, -1).expand(height, width)
    base = torch.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], dim=-1)
    noise = torch.randint(-40, 41, (height, width, 3), generator=g)
    rgb = (base + noise).clamp(0, 255).to(torch.uint8)
    image = Image.frombytes("RGB", (width, height), rgb.numpy().tobytes())
    if mode == "L":
        return image.convert("L")
    if mode == "RGBA":
        alpha = torch.randint(0, 256, (height, width), generator=g, dtype=torch.uint8)
        image.putalpha(Image.frombytes("L", (width, height), alpha.numpy().tobytes()))
        return image
    if mode == "P":
        palette = image.quantize(64)
        palette.info["transparency"] = 3  # one transparent palette entry: composited onto white
        return palette
    return image


@pytest.fixture(scope="module")
def cfg() -> ProcessorConfig:
    return ProcessorConfig.from_dir(MODEL_DIR)


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    return _pil_backend(transformers.Idefics3Processor.from_pretrained(MODEL_DIR, backend="pil").image_processor)


def _pil_backend(image_processor):
    # The PIL backend is the one ffai matches; fail loudly if transformers picks another.
    assert type(image_processor).__name__ == "Idefics3ImageProcessorPil"
    return image_processor


def test_config_from_checkpoint(cfg):
    assert cfg == ProcessorConfig(
        longest_edge=2048,
        tile_size=512,
        resample=Image.Resampling.LANCZOS,
        rescale_factor=1 / 255,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        do_image_splitting=True,
        image_seq_len=64,
        video=None,
        processor_classes={PREPROCESSOR_FILE: "Idefics3Processor", PROCESSOR_FILE: "Idefics3Processor"},
    )


def _copy_configs(tmp_path: Path) -> Path:
    for name in (PREPROCESSOR_FILE, PROCESSOR_FILE):
        shutil.copy(MODEL_DIR / name, tmp_path / name)
    return tmp_path


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_config_missing_file(tmp_path):
    with pytest.raises(ModelError, match=PREPROCESSOR_FILE):
        ProcessorConfig.from_dir(tmp_path)
    shutil.copy(MODEL_DIR / PREPROCESSOR_FILE, tmp_path / PREPROCESSOR_FILE)
    with pytest.raises(ModelError, match=PROCESSOR_FILE):
        ProcessorConfig.from_dir(tmp_path)


@pytest.mark.parametrize(
    "file, edit, message",
    [
        (PREPROCESSOR_FILE, lambda d: d.pop("rescale_factor"), "rescale_factor"),
        (PREPROCESSOR_FILE, lambda d: d["max_image_size"].pop("longest_edge"), "longest_edge"),
        (PREPROCESSOR_FILE, lambda d: d.update(image_processor_type="SiglipImageProcessor"), "SiglipImageProcessor"),
        (PREPROCESSOR_FILE, lambda d: d.update(do_rescale=False), "do_rescale"),
        (PROCESSOR_FILE, lambda d: d.pop("image_seq_len"), "image_seq_len"),
    ],
)
def test_config_bad_key(tmp_path, file, edit, message):
    model_dir = _copy_configs(tmp_path)
    _edit(model_dir / file, edit)
    with pytest.raises(ModelError, match=rf"{file}.*{message}"):
        ProcessorConfig.from_dir(model_dir)


@pytest.mark.parametrize("size", [(0, 10), (10, 0), (16385, 1), (1, 16385)])
def test_image_size_guard(cfg, size):
    with pytest.raises(MediaError, match="16384"):
        preprocess_images([Image.new("L", size)], cfg, split=False)


def test_sizes():
    # Small images are upscaled to the longest edge; the short side is rounded up to even.
    assert longest_edge_size(20, 20, 2048) == (2048, 2048)
    assert longest_edge_size(300, 700, 2048) == (878, 2048)
    assert longest_edge_size(700, 300, 2048) == (2048, 878)
    assert longest_edge_size(1, 16384, 2048) == (1, 2048)
    assert longest_edge_size(3000, 4000, 8192) == (3072, 4096)  # the 4096 cap
    assert tile_multiple_size(878, 2048, 512) == (1024, 2048)
    assert tile_multiple_size(2048, 878, 512) == (2048, 1024)
    assert tile_multiple_size(1536, 2048, 512) == (1536, 2048)


def test_layout_and_values(cfg):
    # A fully transparent image is composited onto white: every value is (1 - 0.5) / 0.5.
    clear = Image.new("RGBA", (300, 700), (0, 0, 0, 0))
    batch = preprocess_images([clear, noisy_gradient(64, 48)], cfg, split=True)
    assert batch.grids == [(4, 2), (3, 4)]
    assert batch.tiles.shape == (4 * 2 + 1 + 3 * 4 + 1, 3, 512, 512)
    assert batch.tiles.dtype == torch.uint8
    assert torch.equal(batch.tiles[:9], torch.full((9, 3, 512, 512), 255, dtype=torch.uint8))
    pixel_values = normalise(batch.tiles, cfg)
    assert pixel_values.dtype == torch.float32 and torch.equal(pixel_values[:9], torch.ones(9, 3, 512, 512))
    assert batch.pixel_attention_mask.shape == (22, 512, 512) and batch.pixel_attention_mask.all()
    unsplit = preprocess_images([clear], cfg, split=False)
    assert unsplit.grids == [(0, 0)] and unsplit.tiles.shape == (1, 3, 512, 512)


def test_a_tile_normalised_alone_is_the_same_bits_as_in_its_batch(cfg):
    # The vision stage normalises tile by tile; the oracle compares whole batches.
    tiles = preprocess_images([noisy_gradient(64, 48)], cfg, split=True).tiles
    whole = normalise(tiles, cfg)
    assert all(torch.equal(normalise(tiles[i : i + 1], cfg)[0], whole[i]) for i in range(tiles.shape[0]))


def _assert_same_as_reference(image_processor, images, split, cfg):
    ref = image_processor([images], do_image_splitting=split, return_row_col_info=True, return_tensors="pt")
    ours = preprocess_images(images, cfg, split=split)
    n = ours.tiles.shape[0]
    # The reference pads the batch with all-zero images; only the first n are real tiles.
    assert ref["pixel_values"].shape[1] == n
    assert (ref["pixel_values"][0] - normalise(ours.tiles, cfg)).abs().max().item() == 0
    assert torch.equal(ref["pixel_attention_mask"][0].bool(), ours.pixel_attention_mask)
    assert ours.grids == list(zip(ref["rows"][0], ref["cols"][0]))


IMAGES = [
    (512, 512, "RGB"),
    (1000, 1000, "RGB"),
    (700, 300, "RGB"),
    (300, 700, "RGB"),
    (20, 20, "RGB"),
    (4000, 3000, "RGB"),
    (640, 480, "L"),
    (333, 517, "RGBA"),
    (401, 299, "P"),
]


@pytest.mark.oracle
@pytest.mark.parametrize("split", [True, False], ids=["split", "unsplit"])
@pytest.mark.parametrize("width, height, mode", IMAGES, ids=[f"{w}x{h}-{m}" for w, h, m in IMAGES])
def test_gate1_one_image(reference, cfg, width, height, mode, split):
    _assert_same_as_reference(reference, [noisy_gradient(width, height, mode, seed=width + height)], split, cfg)


@pytest.mark.oracle
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_gate1_window_of_frames(reference, cfg, threads):
    """Frames are resized side by side on torch's threads: the same tiles, in order, on one thread
    or on more threads than frames."""
    frames = [noisy_gradient(320, 180, seed=s) for s in range(4)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _assert_same_as_reference(reference, frames, False, cfg)
    finally:
        torch.set_num_threads(before)


@pytest.mark.oracle
def test_gate1_split_images_in_one_prompt(reference, cfg):
    _assert_same_as_reference(
        reference, [noisy_gradient(700, 300, seed=1), noisy_gradient(30, 50, "L", seed=2)], True, cfg
    )


@pytest.mark.oracle
def test_gate1_tiny_geometry(tmp_path):
    """The small test checkpoints use 64-pixel tiles and a 256 longest edge: same rules."""
    _copy_configs(tmp_path)
    _edit(
        tmp_path / PREPROCESSOR_FILE,
        lambda d: d.update(max_image_size={"longest_edge": 64}, size={"longest_edge": 256}),
    )
    transformers = pytest.importorskip("transformers")
    # Only the image processor: it is what Idefics3Processor builds from these two files.
    reference = _pil_backend(transformers.AutoImageProcessor.from_pretrained(tmp_path, backend="pil"))
    cfg = ProcessorConfig.from_dir(tmp_path)
    assert (cfg.tile_size, cfg.longest_edge) == (64, 256)
    for split in (True, False):
        _assert_same_as_reference(
            reference, [noisy_gradient(300, 170, seed=5), noisy_gradient(41, 77, "RGBA")], split, cfg
        )


def _mode_samples() -> dict[str, Image.Image]:
    """One small image per Pillow mode the reference's convert_to_rgb may be handed, with
    transparency over strongly non-white colour wherever the mode carries it."""
    rgb = noisy_gradient(23, 17, seed=9)
    alpha = Image.frombytes("L", rgb.size, bytes((17 * i) % 256 for i in range(23 * 17)))
    rgba = rgb.copy()
    rgba.putalpha(alpha)
    grey = rgb.convert("L")
    palette = rgb.quantize(32)
    p_index, p_bytes, rgb_trns, l_trns = palette.copy(), palette.copy(), rgb.copy(), grey.copy()
    p_index.info["transparency"] = 5
    p_bytes.info["transparency"] = bytes((40 * i) % 256 for i in range(32))
    rgb_trns.info["transparency"] = rgb.getpixel((3, 3))
    l_trns.info["transparency"] = grey.getpixel((3, 3))
    ramp = torch.arange(23 * 17, dtype=torch.int32).view(17, 23) * 157
    return {
        "RGB": rgb,
        "RGBA": rgba,
        "LA": Image.merge("LA", (grey, alpha)),
        "PA": Image.merge("PA", (palette, alpha)),
        "P": palette,
        "P+tRNS index": p_index,
        "P+tRNS bytes": p_bytes,
        "RGB+tRNS": rgb_trns,
        "L+tRNS": l_trns,
        "L": grey,
        "1": grey.convert("1"),
        "CMYK": rgb.convert("CMYK"),
        "YCbCr": rgb.convert("YCbCr"),
        "RGBX": rgb.convert("RGBX"),
        "RGBa": rgba.convert("RGBa"),
        "HSV": rgb.convert("HSV"),
        "LAB": rgb.convert("LAB"),
        "I;16": Image.fromarray(ramp.numpy().astype("uint16")),
        "I": Image.fromarray(ramp.numpy()),
        "F": Image.fromarray(ramp.numpy().astype("float32") / 311.0 - 20.0),
    }


TRANSPARENT = ("RGBA", "LA", "PA", "P+tRNS index", "P+tRNS bytes", "RGB+tRNS", "L+tRNS")  # LAB's A is a colour


@pytest.mark.oracle
@pytest.mark.filterwarnings("ignore:Palette images with Transparency expressed in bytes")
@pytest.mark.parametrize("name", list(_mode_samples()))
def test_to_rgb_is_the_reference_conversion_mode_for_mode(name):
    """The one colour conversion on the way to the model is transformers' ``convert_to_rgb``."""
    image_transforms = pytest.importorskip("transformers.image_transforms")
    image = _mode_samples()[name]
    ours = to_rgb(image)
    theirs = image_transforms.convert_to_rgb(image, return_numpy=True)
    assert ours.mode == "RGB" and ours.tobytes() == theirs.tobytes()
    if name in TRANSPARENT:  # compositing onto white is not dropping alpha
        assert ours.tobytes() != image.convert("RGB").tobytes()


@pytest.mark.oracle
def test_to_rgb_refuses_what_the_reference_cannot_convert():
    image_transforms = pytest.importorskip("transformers.image_transforms")
    premultiplied = _mode_samples()["LA"].convert("La")
    with pytest.raises(ValueError):
        image_transforms.convert_to_rgb(premultiplied, return_numpy=True)
    with pytest.raises(MediaError, match=r"^cannot convert a La image to RGB: ") as refused:
        to_rgb(premultiplied)
    assert "\n" not in str(refused.value)
