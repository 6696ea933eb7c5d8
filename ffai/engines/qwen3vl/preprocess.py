"""Pictures for Qwen3-VL, pixel-identical to transformers' processors (5.24).

A still follows ``Qwen2VLImageProcessor`` (the torchvision image processor that
``Qwen3VLProcessor.from_pretrained`` builds for the checkpoint's ``Qwen2VLImageProcessorFast``):

1. convert to RGB (transparency composited onto white), as (3, H, W) uint8;
2. ``smart_resize``: each side rounded to a multiple of patch x merge (32 px), the area then
   scaled into [min_pixels, max_pixels] (``size.shortest_edge`` / ``size.longest_edge``);
3. resize with torchvision's ``resize(BICUBIC, antialias=True)``, which on a CPU hands a uint8
   picture to ``torch.nn.functional.interpolate(mode="bicubic", antialias=True,
   align_corners=False)`` as it is (``_do_native_uint8_resize_on_cpu``): ``resize_tensor`` makes
   that call, so the bytes agree without torchvision;
4. rescale and normalise fused, in float32: (x - mean / rescale) / (std / rescale);
5. patchify into (grid_t * grid_h * grid_w, 3 * temporal_patch * patch * patch): a still is its
   frame repeated ``temporal_patch_size`` times, patches ordered by merge window.
   ``pixel_values`` makes 4 and 5 in the other order, to the same bits (see there).

Windows follow ``Qwen3VLVideoProcessor`` (``video_frames``), sharing steps 1, 3, 4 and 5.

Pictures stay uint8 after step 3 (``Pictures``), a quarter of their floats and cheap to hand to
another process; ``pixel_values`` makes the float patches the model takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ffai.errors import MediaError, ModelError, UsageError
from ffai.kit.config_json import read_json_object
from ffai.kit.pictures import resize_tensor, rgb_tensor
from ffai.media import MAX_SIDE

if TYPE_CHECKING:  # pragma: no cover - typing only; torch and PIL load lazily
    import torch
    from PIL import Image

PREPROCESSOR_FILE = "preprocessor_config.json"
VIDEO_PREPROCESSOR_FILE = "video_preprocessor_config.json"
IMAGE_PROCESSOR_TYPES = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast")
VIDEO_PROCESSOR_TYPES = ("Qwen3VLVideoProcessor",)
# Flags the reference can switch off but every Qwen3-VL checkpoint keeps on (the classes'
# defaults); ffai implements only the "on" path and refuses a file that asks for anything else.
REQUIRED_FLAGS = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")
BICUBIC = 3  # PIL's filter number, the processors' default resample
MAX_ASPECT = 200  # smart_resize refuses a picture whose long side exceeds 200x its short side
# Qwen3VLVideoProcessor's class defaults for its optional per-frame cap (absent from the files).
VIDEO_MAX_TOKENS = 768


@dataclass(frozen=True)
class PixelBudget:
    """The area a picture is resized into: per image for stills, per clip (all frames) for video."""

    min_pixels: int  # size.shortest_edge
    max_pixels: int  # size.longest_edge


@dataclass(frozen=True)
class ProcessorConfig:
    """The checkpoint's image and video processor settings (preprocessor_config.json and
    video_preprocessor_config.json). The two files must agree on patch geometry and
    normalisation: the one vision tower sees both kinds of picture."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float
    image: PixelBudget
    video: PixelBudget
    cap_pixels_per_frame: bool  # the video processor's opt-in per-frame cap (off unless the file sets it)
    max_video_tokens: int

    @property
    def factor(self) -> int:
        """Sides are resized to multiples of this: one merged patch (32 px for Qwen3-VL)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values per patch row of ``pixel_values``: 3 * temporal_patch * patch * patch."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    def tokens(self, grid: tuple[int, int, int]) -> int:
        """Placeholder tokens for a picture with this (t, h, w) patch grid: one per merge window."""
        t, h, w = grid
        return t * h * w // self.merge_size**2

    @classmethod
    def from_dir(cls, model_dir: Path) -> ProcessorConfig:
        image_path = Path(model_dir) / PREPROCESSOR_FILE
        video_path = Path(model_dir) / VIDEO_PREPROCESSOR_FILE
        image = _Reader(read_json_object(image_path, "image processor config"), image_path)
        video = _Reader(read_json_object(video_path, "video processor config"), video_path)
        image.check_type("image_processor_type", IMAGE_PROCESSOR_TYPES)
        video.check_type("video_processor_type", VIDEO_PROCESSOR_TYPES)
        shared = {}
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            shared[name] = image.positive_int(name)
            if video.positive_int(name) != shared[name]:
                raise ModelError(f"{video_path}: {name} {video.data[name]} differs from {image_path.name}'s")
        for name in ("image_mean", "image_std"):
            shared[name] = image.triple(name)
            if video.triple(name) != shared[name]:
                raise ModelError(f"{video_path}: {name} differs from {image_path.name}'s")
        rescale = image.number("rescale_factor", 1 / 255)
        if video.number("rescale_factor", 1 / 255) != rescale:
            raise ModelError(f"{video_path}: rescale_factor differs from {image_path.name}'s")
        for reader in (image, video):
            reader.check_flags()
        return cls(
            **shared,
            rescale_factor=rescale,
            image=image.budget(),
            video=video.budget(),
            cap_pixels_per_frame=video.flag("cap_pixels_per_frame", False),
            max_video_tokens=video.positive_int("max_video_tokens", VIDEO_MAX_TOKENS),
        )

    def with_pixels(
        self,
        *,
        image_min: int | None = None,
        image_max: int | None = None,
        video_min: int | None = None,
        video_max: int | None = None,
    ) -> ProcessorConfig:
        """These settings with some pixel bounds replaced (None keeps the checkpoint's), as the
        reference's ``size={"shortest_edge": ..., "longest_edge": ...}`` replaces them."""
        image = PixelBudget(
            self.image.min_pixels if image_min is None else image_min,
            self.image.max_pixels if image_max is None else image_max,
        )
        video = PixelBudget(
            self.video.min_pixels if video_min is None else video_min,
            self.video.max_pixels if video_max is None else video_max,
        )
        for kind, budget in (("image", image), ("video", video)):
            if not 0 < budget.min_pixels <= budget.max_pixels:
                raise UsageError(
                    f"{kind} pixels: the minimum ({budget.min_pixels}) must be positive and at most "
                    f"the maximum ({budget.max_pixels})"
                )
        return replace(self, image=image, video=video)


@dataclass
class Pictures:
    """The resized uint8 pictures of one prompt, in order, with their patch grids: everything
    ``pixel_values`` needs, at a quarter of its size. A still's frames are (1, 3, H, W) (its
    temporal copies are made in ``patchify``); a video's are (T, 3, H, W) with T a multiple of
    the temporal patch."""

    frames: list[torch.Tensor]
    grid_thw: torch.Tensor  # (n, 3) long: (t, h, w) in patches, as the reference's *_grid_thw

    @property
    def grids(self) -> list[tuple[int, int, int]]:
        return [tuple(int(v) for v in row) for row in self.grid_thw.tolist()]


def preprocess_images(images: Sequence[Image.Image], cfg: ProcessorConfig) -> Pictures:
    """Each still resized as the image processor resizes it; sizes are checked before any work."""
    import torch

    sizes = [image_size(image.height, image.width, cfg) for image in images]
    frames, grids = [], []
    for image, (height, width) in zip(images, sizes):
        frames.append(resize_tensor(rgb_tensor(image), (height, width), BICUBIC))  # (1, 3, height, width)
        grids.append((1, height // cfg.patch_size, width // cfg.patch_size))
    return Pictures(frames, torch.tensor(grids, dtype=torch.long).view(-1, 3))


def image_size(height: int, width: int, cfg: ProcessorConfig) -> tuple[int, int]:
    """(height, width) a still of this size is resized to; one line for a picture ffai refuses."""
    check_picture_size(height, width)
    return smart_resize(height, width, cfg.factor, cfg.image.min_pixels, cfg.image.max_pixels)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Sides rounded to multiples of ``factor``, then scaled (aspect kept) into the pixel range:
    ``Qwen2VLImageProcessor``'s smart_resize, Python's round (half to even) included."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def check_picture_size(height: int, width: int) -> None:
    """Refuse what the reference refuses (aspect over 200) and absurd inputs, in one line."""
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise MediaError(f"picture of {width}x{height} pixels: each side must be 1..{MAX_SIDE}")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise MediaError(f"picture of {width}x{height} pixels: Qwen3-VL takes aspect ratios up to {MAX_ASPECT}:1")


def patchify(x: torch.Tensor, cfg: ProcessorConfig) -> torch.Tensor:
    """(T, 3, H, W) -> (T/tp * H/p * W/p, 3 * tp * p * p), rows ordered frame pair, merge window,
    position in the window, as the processors' patchify; T = 1 (a still) is repeated ``tp`` times.
    Layout only: any dtype goes through unchanged."""
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if x.shape[0] == 1:
        x = x.expand(tp, -1, -1, -1)
    t, c, h, w = x.shape
    gt, gh, gw = t // tp, h // p, w // p
    x = x.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    # (gt, gh/m, gw/m, m, m, c, tp, p, p): merge windows outermost, then the values of one patch
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p)


def pixel_values(pictures: Pictures, cfg: ProcessorConfig) -> torch.Tensor:
    """The float32 patches of all pictures, concatenated: the reference's ``pixel_values`` (stills)
    or ``pixel_values_videos`` (a window), bit for bit. The reference normalises, then patchifies;
    this patchifies the uint8 pictures, then applies the same two float ops to each value with its
    channel's mean and std, so the floats are written once (a 64-frame 720p window: 286 MB)."""
    import torch

    patches = torch.cat([patchify(frames, cfg) for frames in pictures.frames])  # (n, 3 * tp * p * p) uint8
    mean, std = _scaled_mean_std(cfg)
    per_channel = cfg.patch_dim // 3  # a row holds each channel's tp * p * p values in turn
    mean, std = mean.repeat_interleave(per_channel), std.repeat_interleave(per_channel)
    return patches.to(torch.float32).sub_(mean).div_(std)


def _scaled_mean_std(cfg: ProcessorConfig) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    return (
        torch.tensor(cfg.image_mean) * (1.0 / cfg.rescale_factor),
        torch.tensor(cfg.image_std) * (1.0 / cfg.rescale_factor),
    )


_MISSING = object()


class _Reader:
    """Typed reads from one processor file, with errors naming the file and the key."""

    def __init__(self, data: dict, path: Path) -> None:
        self.data, self.path = data, path

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise ModelError(f"{self.path}: missing key {key!r}")
        return default

    def check_type(self, key: str, accepted: tuple[str, ...]) -> None:
        kind = self.get(key)
        if kind not in accepted:
            raise ModelError(f"{self.path}: {key} {kind!r} is not one of {', '.join(accepted)}")

    def positive_int(self, key: str, default: Any = _MISSING) -> int:
        value = self.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelError(f"{self.path}: {key} must be a positive integer, got {value!r}")
        return value

    def number(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ModelError(f"{self.path}: {key} must be a positive number, got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if value is None:  # the video processor's "unset", which it treats as false
            return False
        if not isinstance(value, bool):
            raise ModelError(f"{self.path}: {key} must be true or false, got {value!r}")
        return value

    def triple(self, key: str) -> tuple[float, float, float]:
        value = self.get(key)
        if not (isinstance(value, list) and len(value) == 3):
            raise ModelError(f"{self.path}: {key} must be 3 numbers (RGB)")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise ModelError(f"{self.path}: {key} must be 3 numbers (RGB)")
        return tuple(float(v) for v in value)

    def check_flags(self) -> None:
        for flag in REQUIRED_FLAGS:
            if self.flag(flag, True) is not True:
                raise ModelError(f"{self.path}: {flag} must be true (ffai implements only that path)")
        resample = self.get("resample", BICUBIC)
        if resample != BICUBIC:
            raise ModelError(f"{self.path}: resample {resample!r}: ffai resizes Qwen3-VL pictures bicubic (3) only")

    def budget(self) -> PixelBudget:
        size = self.get("size")
        if not isinstance(size, dict):
            raise ModelError(f"{self.path}: size must be a JSON object")
        bounds = []
        for key in ("shortest_edge", "longest_edge"):
            value = size.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelError(f"{self.path}: size.{key} must be a positive integer, got {value!r}")
            bounds.append(value)
        if bounds[0] > bounds[1]:
            raise ModelError(f"{self.path}: size.shortest_edge exceeds size.longest_edge")
        return PixelBudget(*bounds)
