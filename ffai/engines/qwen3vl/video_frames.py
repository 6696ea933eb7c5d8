"""A window's frames as one video clip, pixel-identical to transformers' ``Qwen3VLVideoProcessor``
(5.24) given those frames and their times.

How ffai presents a window (as for SmolVLM2): the window is its own clip. Its frames are the
ones ffai sampled, in order, and a frame's time is its time in the source minus the window's
start, so a clip's first frame is at 0 s; cue times stay the source's. The reference is given
the same thing: ``videos=[frames]`` with ``VideoMetadata(fps=1.0, frames_indices=times)`` (an
"index" at 1 frame per second is a time in seconds) and ``do_sample_frames=False`` (ffai did the
sampling; the processor's own would renumber the frames 0, 1, 2, ... and lose their times).

What the processor then does, and this module with it:

1. every frame to RGB, stacked (T, 3, H, W) uint8 (all frames of a clip are one size);
2. one size for the whole clip (``video_smart_resize``): sides to multiples of 32 px, the area
   of all frames together (T rounded to pairs) scaled into the video pixel range, so a longer
   window gets smaller frames; resized as stills are (``preprocess.resize_tensor``);
3. an odd frame count padded with copies of the last frame to whole pairs (temporal patch 2);
4. each pair's time for the prompt (``pair_times``): the mean of its first and last frame's time,
   the padded copy taking the last frame's time; written ``<{t:.1f} seconds>``.

A window of one frame is shown as that frame twice at its time: the processor refuses a
one-frame video (its smart_resize needs at least ``temporal_patch_size`` frames), and two copies
are what its padding makes of an odd count, so ffai gives both itself and the reference the
frame twice (``clip_frames``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ffai.errors import MediaError
from ffai.kit.pictures import resize_tensor, rgb_tensor

from .preprocess import BICUBIC, MAX_ASPECT, Pictures, ProcessorConfig, check_picture_size

if TYPE_CHECKING:  # pragma: no cover - typing only; torch and PIL load lazily
    from PIL import Image


def clip_frames(images: Sequence[Image.Image], times: Sequence[float], start: float) -> tuple[list, list[float]]:
    """The frames and times of a window as the clip ffai shows (and gives the reference): times
    from the window's ``start``, and a lone frame doubled (see the module's docstring)."""
    if len(images) != len(times) or not images:
        raise ValueError(f"a window needs one time per frame, got {len(images)} frames and {len(times)} times")
    frames, clip_times = list(images), [float(t) - start for t in times]
    if len(frames) == 1:
        frames, clip_times = frames * 2, clip_times * 2
    return frames, clip_times


def preprocess_video(images: Sequence[Image.Image], cfg: ProcessorConfig) -> Pictures:
    """The clip's frames resized as the video processor resizes them, padded to whole pairs; one
    grid (pairs, h, w) in patches. ``images`` as ``clip_frames`` gives them (two or more)."""
    import torch

    sizes = {(image.height, image.width) for image in images}
    if len(sizes) != 1:
        raise MediaError(f"the frames of one window differ in size: {sorted(sizes)}")
    height, width = video_size(len(images), *sizes.pop(), cfg)
    n = len(images) + -len(images) % cfg.temporal_patch_size
    x = torch.empty(n, 3, height, width, dtype=torch.uint8)
    # One frame at a time: the reference resizes the stacked clip, but each frame's planes are
    # resized alone either way, and only one full-size frame is held at once (64 1080p frames: 400 MB).
    for i, image in enumerate(images):
        x[i] = resize_tensor(rgb_tensor(image), (height, width), BICUBIC)[0]
    x[len(images) :] = x[len(images) - 1]  # an odd count padded with the last frame
    grid = (n // cfg.temporal_patch_size, height // cfg.patch_size, width // cfg.patch_size)
    return Pictures([x], torch.tensor([grid], dtype=torch.long))


def video_size(n_frames: int, height: int, width: int, cfg: ProcessorConfig) -> tuple[int, int]:
    """(height, width) every frame of an ``n_frames`` clip of this frame size is resized to."""
    check_picture_size(height, width)
    if n_frames < cfg.temporal_patch_size:
        raise ValueError(f"a clip of {n_frames} frames: clip_frames doubles a lone frame first")
    return video_smart_resize(
        n_frames,
        height,
        width,
        cfg.temporal_patch_size,
        cfg.factor,
        cfg.video.min_pixels,
        clip_max_pixels(n_frames, cfg),
    )


def clip_max_pixels(n_frames: int, cfg: ProcessorConfig) -> int:
    """The most pixels all frames of an ``n_frames`` clip may hold together."""
    if not cfg.cap_pixels_per_frame:
        return cfg.video.max_pixels
    # The processor's opt-in cap: a frame costs at most max_video_tokens merged patches, or its
    # even share of the clip's budget, but never under 1.05 x the minimum.
    frame_cap = cfg.max_video_tokens * cfg.factor**2
    return max(min(frame_cap, cfg.video.max_pixels // n_frames), int(cfg.video.min_pixels * 1.05)) * n_frames


def video_smart_resize(
    n_frames: int, height: int, width: int, temporal_factor: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """``Qwen3VLVideoProcessor``'s smart_resize: a frame smaller than ``factor`` scaled up first
    (aspect kept, truncated), then ``Qwen2VLImageProcessor``'s rule on the area of all frames, the
    frame count rounded (half to even) to a multiple of ``temporal_factor``."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
        if max(height, width) / min(height, width) > MAX_ASPECT:  # truncation can tip it over
            raise MediaError(
                f"a frame scaled up to {width}x{height}: Qwen3-VL takes aspect ratios up to {MAX_ASPECT}:1"
            )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(n_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((n_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (n_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def video_grid(n_frames: int, height: int, width: int, cfg: ProcessorConfig) -> tuple[int, int, int]:
    """The (t, h, w) patch grid of a window of ``n_frames`` frames of this size, without pixels
    (what the window check counts tokens from): ``preprocess_video``'s grid for the clip that
    ``clip_frames`` makes of it."""
    n = max(n_frames, 2)  # a lone frame is doubled
    rows, cols = video_size(n, height, width, cfg)
    return (n + -n % cfg.temporal_patch_size) // cfg.temporal_patch_size, rows // cfg.patch_size, cols // cfg.patch_size


def pair_times(times: Sequence[float], temporal_patch_size: int) -> list[float]:
    """Each frame pair's time, as ``Qwen3VLProcessor._calculate_timestamps`` computes it at 1 fps:
    times padded with the last to whole pairs, then the mean of each pair's first and last."""
    times = [float(t) for t in times]
    times += times[-1:] * (-len(times) % temporal_patch_size)
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def widest_video_tokens(n_frames: int, cfg: ProcessorConfig) -> int:
    """At most this many ``<|video_pad|>`` tokens for a window of ``n_frames`` frames of any size
    ffai accepts (aspect up to 200:1), for a window check made before frames are seen. From
    ``video_smart_resize``'s three branches, per frame (f = 32 px, M = the clip's maximum, m its
    minimum, r <= 200 the aspect): kept, T_bar * area <= M; shrunk, each side is at most f or its
    share of M / n, so area <= max(M / n, f * sqrt(r * M / n), f^2); grown, each side is under
    its share of m / n plus f."""
    n = max(n_frames, 2)  # a lone frame is doubled
    f, tp = cfg.factor, cfg.temporal_patch_size
    most, least = clip_max_pixels(n, cfg), cfg.video.min_pixels
    t_bar = round(n / tp) * tp
    kept = most / t_bar
    shrunk = max(most / n, f * math.sqrt(MAX_ASPECT * most / n), f * f)
    grown = least / n + f * math.sqrt(least / n) * (math.sqrt(MAX_ASPECT) + 1 / math.sqrt(MAX_ASPECT)) + f * f
    pairs = (n + -n % tp) // tp
    return pairs * math.floor(max(kept, shrunk, grown) / (f * f))
