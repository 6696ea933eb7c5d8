"""A window's frames as one video clip, pixel-identical to transformers' ``SmolVLMVideoProcessor``
(5.24; SmolVLM2 checkpoints, whose preprocessor config has ``video_sampling``).

The video processor works on uint8 tensors through torchvision, whose resize on a CPU hands
uint8 frames to ``torch.nn.functional.interpolate`` as they are, so the same torch call
(``preprocess.resize_tensor``) gives the same bytes without torchvision:

1. each frame's longest edge to ``VideoSampling.longest_edge``, the other edge rounded up to
   even (``get_resize_output_image_size``);
2. squashed to tile x tile (``max_image_size``): frames are never split;
3. normalised as the checkpoint's stills are (``preprocess.normalise``, fused for these checkpoints).

Frames stay uint8 until the vision stage normalises them one at a time, as a still's tiles do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ffai.errors import ModelError
from ffai.kit.pictures import check_image_size, resize_tensor, rgb_tensor

from .preprocess import MAX_RESIZED_EDGE, PixelBatch, ProcessorConfig, longest_edge_size

if TYPE_CHECKING:  # pragma: no cover - typing only; torch and PIL load lazily
    from PIL import Image


def preprocess_video(images: Sequence[Image.Image], cfg: ProcessorConfig) -> PixelBatch:
    """One unsplit tile per frame, as the video processor makes them; each frame's grid is (0, 0)."""
    import torch

    if cfg.video is None:
        raise ModelError("this checkpoint's processor has no video_sampling: its windows are images")
    for image in images:
        check_image_size(image)
    t, edge = cfg.tile_size, min(MAX_RESIZED_EDGE, cfg.video.longest_edge)
    tiles = torch.empty(len(images), 3, t, t, dtype=torch.uint8)
    for i, image in enumerate(images):
        x = rgb_tensor(image)  # (1, 3, H, W)
        x = resize_tensor(x, longest_edge_size(x.shape[2], x.shape[3], edge), cfg.resample)
        tiles[i] = resize_tensor(x, (t, t), cfg.resample)[0]
    mask = torch.ones(len(images), t, t, dtype=torch.bool)
    return PixelBatch(tiles=tiles, pixel_attention_mask=mask, grids=[(0, 0)] * len(images))
