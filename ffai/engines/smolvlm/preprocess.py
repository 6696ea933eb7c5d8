"""Image preprocessing for SmolVLM (Idefics3), pixel-identical to transformers.

Follows ``Idefics3ImageProcessorPil`` (transformers 5.24, the class that
``Idefics3Processor.from_pretrained`` builds when torchvision is absent or ``backend="pil"``):

1. convert to RGB (transparency composited onto white): the only colour conversion on the way
   from a file to the model, since ``ffai.media`` hands over a still in the mode it was read;
2. resize so the longest edge is ``size.longest_edge`` (2048) -- small images are upscaled too;
3. split mode: resize up to multiples of the tile (512), cut row-major tiles, then append a
   global image squashed to tile x tile; unsplit mode: squash the image to tile x tile;
4. rescale by 1/255 in float64, cast to float32, then normalise in float32 (``normalise``).

Every resize is Pillow's ``Image.resize`` on 8-bit RGB, exactly as the reference does it, so
the uint8 pixels agree bit for bit; step 4's float order then makes the floats agree too.
``preprocess_images`` stops before step 4: its tiles stay uint8, a quarter of their floats, and
the vision stage normalises them one at a time as it encodes them (``model.encode_images``), so
a window's or a still's float tiles are never all in memory at once (8 frames: 25 MB).

SmolVLM2 checkpoints (``video_sampling`` in their preprocessor config) follow
``SmolVLMImageProcessor`` instead: transformers builds ``SmolVLMProcessor`` only with torchvision
(its video processor needs it), and then with the torchvision image processor, whose resizes are
torch's uint8 kernels (``resize_tensor``) and whose rescale and normalise are one fused step
(``normalise``). Same geometry, same tiles, different rounding; see ``ProcessorConfig.torch_resize``.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ffai.errors import ModelError
from ffai.kit.config_json import read_json_object
from ffai.kit.pictures import TORCH_INTERPOLATION, check_image_size, resize_tensor, rgb_tensor, to_rgb

if TYPE_CHECKING:  # pragma: no cover - typing only; torch and PIL load lazily
    import torch
    from PIL import Image

PREPROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"
# SmolVLM2's image processors are Idefics3's under new names (transformers' modular_smolvlm.py).
IMAGE_PROCESSOR_TYPES = tuple(
    f"{family}ImageProcessor{backend}" for family in ("Idefics3", "SmolVLM") for backend in ("", "Pil", "Fast")
)
# Flags the reference can switch off but that every Idefics3 checkpoint keeps on; ffai
# implements only the "on" path and refuses a checkpoint that asks for anything else.
REQUIRED_FLAGS = ("do_convert_rgb", "do_resize", "do_rescale", "do_normalize", "do_pad")
# The reference's absolute cap on the resized image (its MAX_IMAGE_SIZE).
MAX_RESIZED_EDGE = 4096


@dataclass(frozen=True)
class VideoSampling:
    """``video_sampling`` of a checkpoint whose processor knows video (SmolVLM2): how its video
    processor sizes frames. ``fps`` and ``max_frames`` drive its own sampling of a file, which
    ffai's windows replace; they are kept for what they say about the training clips."""

    # Each frame's first resize target: video_size.longest_edge, except that the reference's video
    # processor replaces video_size by the config's ``size`` where both are given (SmolVLM2's
    # files give both: 512 and 2048, and 2048 is what it uses).
    longest_edge: int
    fps: float
    max_frames: int


@dataclass(frozen=True)
class ProcessorConfig:
    """The checkpoint's image processor settings (preprocessor_config.json + processor_config.json)."""

    longest_edge: int  # size.longest_edge: the first resize target
    tile_size: int  # max_image_size.longest_edge: tile side, global image side
    resample: int  # a PIL resampling filter number (1 = LANCZOS)
    rescale_factor: float
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    do_image_splitting: bool  # the checkpoint's default; callers choose per request
    image_seq_len: int  # image tokens per tile in the prompt
    video: VideoSampling | None  # None: an image-only checkpoint (no video_sampling)
    processor_classes: dict[str, str]  # file name -> the processor_class it names, where it names one

    @property
    def torch_resize(self) -> bool:
        """Resize with torch and normalise fused (the torchvision image processor), not with
        Pillow: the reference processor of a checkpoint that knows video exists only that way."""
        return self.video is not None

    @classmethod
    def from_dir(cls, model_dir: Path) -> ProcessorConfig:
        pre_path = Path(model_dir) / PREPROCESSOR_FILE
        pre = read_json_object(pre_path, "image processor config")
        kind = _key(pre, "image_processor_type", pre_path)
        if kind not in IMAGE_PROCESSOR_TYPES:
            raise ModelError(f"{pre_path}: image_processor_type {kind!r} is not an Idefics3 image processor")
        for flag in REQUIRED_FLAGS:
            if _key(pre, flag, pre_path) is not True:
                raise ModelError(f"{pre_path}: {flag} must be true (ffai implements only that path)")
        proc_path = Path(model_dir) / PROCESSOR_FILE
        proc = read_json_object(proc_path, "processor config")
        cfg = cls(
            longest_edge=_key(_key(pre, "size", pre_path), "longest_edge", pre_path),
            tile_size=_key(_key(pre, "max_image_size", pre_path), "longest_edge", pre_path),
            resample=_key(pre, "resample", pre_path),
            rescale_factor=float(_key(pre, "rescale_factor", pre_path)),
            image_mean=tuple(float(v) for v in _key(pre, "image_mean", pre_path)),
            image_std=tuple(float(v) for v in _key(pre, "image_std", pre_path)),
            do_image_splitting=_key(pre, "do_image_splitting", pre_path),
            image_seq_len=_key(proc, "image_seq_len", proc_path),
            video=_video_sampling(pre, pre_path),
            processor_classes={
                path.name: data["processor_class"]
                for path, data in ((pre_path, pre), (proc_path, proc))
                if isinstance(data.get("processor_class"), str)
            },
        )
        cfg._validate(pre_path, proc_path)
        return cfg

    def _validate(self, pre_path: Path, proc_path: Path) -> None:
        for name in ("longest_edge", "tile_size", "resample"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ModelError(f"{pre_path}: {name} must be a non-negative integer")
        if self.tile_size == 0 or self.longest_edge == 0:
            raise ModelError(f"{pre_path}: size and max_image_size must be positive")
        if self.resample > 5:
            raise ModelError(f"{pre_path}: resample {self.resample} is not a Pillow filter")
        if self.torch_resize and self.resample not in TORCH_INTERPOLATION:
            raise ModelError(
                f"{pre_path}: resample {self.resample}: a video checkpoint's pictures are resized by torch, "
                f"which ffai does for Pillow filters {sorted(TORCH_INTERPOLATION)} only"
            )
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ModelError(f"{pre_path}: image_mean and image_std need 3 values (RGB)")
        if not isinstance(self.do_image_splitting, bool):
            raise ModelError(f"{pre_path}: do_image_splitting must be true or false")
        if not isinstance(self.image_seq_len, int) or self.image_seq_len < 1:
            raise ModelError(f"{proc_path}: image_seq_len must be a positive integer")


@dataclass
class PixelBatch:
    """The tiles of all images of one prompt, in the reference's order."""

    tiles: torch.Tensor  # (n_tiles, 3, tile, tile) uint8, RGB: ``normalise`` makes the model's input
    pixel_attention_mask: torch.Tensor  # (n_tiles, tile, tile) bool
    grids: list[tuple[int, int]]  # per image (rows, cols); (0, 0) for an unsplit image


def preprocess_images(images: Sequence[Image.Image], cfg: ProcessorConfig, *, split: bool) -> PixelBatch:
    """The tiles of the images of one prompt: per image its row-major tiles then its global
    image (``split``), or the squashed image alone. Sizes are checked before any work."""
    import torch

    for image in images:
        check_image_size(image)
    frames: list[Image.Image] = []
    grids: list[tuple[int, int]] = []
    for image_frames, grid in _frames_of_each(images, cfg, split):
        frames += image_frames
        grids.append(grid)
    t = cfg.tile_size
    tiles = torch.empty(len(frames), 3, t, t, dtype=torch.uint8)
    for i, frame in enumerate(frames):
        if isinstance(frame, torch.Tensor):
            tiles[i] = frame
        else:
            tiles[i] = torch.frombuffer(bytearray(frame.tobytes()), dtype=torch.uint8).view(t, t, 3).permute(2, 0, 1)
    # Every frame is exactly tile x tile (see _frames), so the reference's padding to the
    # largest frame in the batch never pads and its mask is all ones.
    mask = torch.ones(len(frames), t, t, dtype=torch.bool)
    return PixelBatch(tiles=tiles, pixel_attention_mask=mask, grids=grids)


def _frames_of_each(
    images: Sequence[Image.Image], cfg: ProcessorConfig, split: bool
) -> list[tuple[list[Image.Image], tuple[int, int]]]:
    """``_frames`` of every image, in order, the images resized side by side on as many threads
    as torch has here (Pillow's resize lets go of the GIL). The reference's resizes are LANCZOS,
    and the first goes through a 2048-pixel long edge, which made them most of a window's
    preprocessing on one thread (docs/benchmarks.md). Each image's resizes are the same calls on
    the same pixels, whichever thread makes them, so the frames are the same bytes."""
    import torch

    workers = min(len(images), torch.get_num_threads())
    if workers <= 1:
        return [_frames(image, cfg, split) for image in images]
    with ThreadPoolExecutor(workers, thread_name_prefix="ffai-resize") as pool:
        return list(pool.map(lambda image: _frames(image, cfg, split), images))


def _frames(image: Image.Image, cfg: ProcessorConfig, split: bool) -> tuple[list, tuple[int, int]]:
    """The uint8 RGB frames of one image, row-major tiles then the global image, and its grid."""
    if cfg.torch_resize:
        return _tensor_frames(image, cfg, split)
    rgb = to_rgb(image)
    rgb = _resize(rgb, longest_edge_size(rgb.height, rgb.width, cfg.longest_edge), cfg.resample)
    t = cfg.tile_size
    if not split:
        return [_resize(rgb, (t, t), cfg.resample)], (0, 0)
    rgb = _resize(rgb, tile_multiple_size(rgb.height, rgb.width, t), cfg.resample)
    # Sides are now multiples of t, so a side <= t is exactly t: one frame, no split.
    if rgb.height <= t and rgb.width <= t:
        return [rgb], (0, 0)
    rows, cols = rgb.height // t, rgb.width // t
    tiles = [rgb.crop((c * t, r * t, (c + 1) * t, (r + 1) * t)) for r in range(rows) for c in range(cols)]
    return [*tiles, _resize(rgb, (t, t), cfg.resample)], (rows, cols)


def _tensor_frames(image: Image.Image, cfg: ProcessorConfig, split: bool) -> tuple[list, tuple[int, int]]:
    """``_frames`` as the torchvision image processor makes them: (3, t, t) uint8 tensors."""
    x = rgb_tensor(image)  # (1, 3, H, W)
    x = resize_tensor(x, longest_edge_size(x.shape[2], x.shape[3], cfg.longest_edge), cfg.resample)
    t = cfg.tile_size
    if not split:
        return [resize_tensor(x, (t, t), cfg.resample)[0]], (0, 0)
    x = resize_tensor(x, tile_multiple_size(x.shape[2], x.shape[3], t), cfg.resample)
    if x.shape[2] <= t and x.shape[3] <= t:
        return [x[0]], (0, 0)
    rows, cols = x.shape[2] // t, x.shape[3] // t
    tiles = [x[0, :, r * t : (r + 1) * t, c * t : (c + 1) * t] for r in range(rows) for c in range(cols)]
    return [*tiles, resize_tensor(x, (t, t), cfg.resample)[0]], (rows, cols)


def longest_edge_size(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """(height, width) with the longest edge set to ``longest_edge`` (up or down), the other edge
    rounded up to even, then capped at the reference's MAX_RESIZED_EDGE."""
    aspect = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest_edge
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    # Second pass of the reference: only ever shrinks, never rounds to even.
    aspect = width / height
    if width >= height and width > MAX_RESIZED_EDGE:
        width = MAX_RESIZED_EDGE
        height = int(width / aspect)
    elif height > width and height > MAX_RESIZED_EDGE:
        height = MAX_RESIZED_EDGE
        width = int(height * aspect)
    return max(height, 1), max(width, 1)


def tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """(height, width) grown to multiples of ``tile``; the short side follows the long side's
    aspect ratio first (the reference's resize_for_vision_encoder)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def _resize(image: Image.Image, size: tuple[int, int], resample: int) -> Image.Image:
    height, width = size
    return image.resize((width, height), resample=resample)


def normalise(tiles: torch.Tensor, cfg: ProcessorConfig) -> torch.Tensor:
    """(n, 3, t, t) uint8 tiles -> float32, with the reference's float order: multiply by the
    rescale factor in float64, round to float32, then (x - mean) / std in float32; for a
    ``torch_resize`` checkpoint the torchvision processors' fused order instead. Elementwise,
    so a tile normalised alone is the same bits as in any batch."""
    import torch

    if cfg.torch_resize:
        # mean and std scaled by 1 / rescale_factor in float32, then (x - mean) / std
        mean = (torch.tensor(cfg.image_mean) * (1.0 / cfg.rescale_factor)).view(3, 1, 1)
        std = (torch.tensor(cfg.image_std) * (1.0 / cfg.rescale_factor)).view(3, 1, 1)
        return tiles.to(torch.float32).sub_(mean).div_(std)

    mean = torch.tensor(cfg.image_mean, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(cfg.image_std, dtype=torch.float32).view(3, 1, 1)
    out = torch.empty(tiles.shape, dtype=torch.float32)
    # One tile at a time keeps the float64 intermediate to a single tile.
    for i, tile in enumerate(tiles):
        x = (tile.to(torch.float64) * cfg.rescale_factor).to(torch.float32)
        out[i] = (x - mean) / std
    return out


def _video_sampling(pre: dict, path: Path) -> VideoSampling | None:
    if pre.get("video_sampling") is None:
        return None
    sampling = _key(pre, "video_sampling", path)
    size = pre["size"] if "size" in pre else _key(sampling, "video_size", path)
    video = VideoSampling(
        longest_edge=_key(size, "longest_edge", path),
        fps=_key(sampling, "fps", path),
        max_frames=_key(sampling, "max_frames", path),
    )
    if not isinstance(video.longest_edge, int) or isinstance(video.longest_edge, bool) or video.longest_edge < 1:
        raise ModelError(f"{path}: video_sampling.video_size.longest_edge must be a positive integer")
    if not isinstance(video.max_frames, int) or isinstance(video.max_frames, bool) or video.max_frames < 1:
        raise ModelError(f"{path}: video_sampling.max_frames must be a positive integer")
    if not isinstance(video.fps, (int, float)) or isinstance(video.fps, bool) or not video.fps > 0:
        raise ModelError(f"{path}: video_sampling.fps must be a positive number")
    return video


def _key(data: Any, key: str, path: Path) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise ModelError(f"{path}: missing key {key!r}")
    return data[key]
