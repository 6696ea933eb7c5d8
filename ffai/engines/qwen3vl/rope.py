"""Multimodal RoPE: the text tower's 3-row positions (time, height, width) and their rotary angles.

``rope_index`` follows transformers 5.24's ``Qwen3VLModel.get_rope_index`` for one prompt: text
tokens count up on all three rows; a run of image or video tokens takes its grid's (t, h, w)
positions (h and w after the spatial merge) offset by the position where it starts, and the next
text resumes at that start + max(h, w). A video's grid is split into one grid per frame pair (t=1
each), as its frames are separated by their ``<t seconds>`` timestamps in the prompt. The delta
(last position + 1 - prompt length) places every later token: generated token i sits at
``prompt length + i + delta`` on all three rows.

``rope_rows`` follows ``Qwen3VLTextRotaryEmbedding`` with ``mrope_interleaved``: frequency j
takes its angle from the height row where j % 3 == 1 and j < 3 * section[1], from the width row
where j % 3 == 2 and j < 3 * section[2], else from the time row. The selection is made on the
angles before cos/sin, which are elementwise, so the values are the reference's bit for bit. Where
the three rows are equal (every token after the prompt) the angles are plain RoPE's, so the text
tower's own table gives those tokens' rows (``ffai.kit.generate``).
"""

from __future__ import annotations

from itertools import groupby
from typing import Sequence

import torch

from ffai.errors import EngineError
from ffai.kit.rope import inv_freq, rotary
from ffai.kit.text_config import TextConfig

TEXT, IMAGE, VIDEO = 0, 1, 2


def token_types(input_ids: torch.Tensor, image_token_id: int, video_token_id: int) -> torch.Tensor:
    """(T,) ids -> (T,) 0 text, 1 image, 2 video (the processor's ``mm_token_type_ids``)."""
    types = torch.zeros_like(input_ids)
    types[input_ids == image_token_id] = IMAGE
    types[input_ids == video_token_id] = VIDEO
    return types


def per_frame_grids(video_grid_thw: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """A video's (t, h, w) rows as t rows of (1, h, w): one per frame pair."""
    if video_grid_thw is None:
        return []
    return [(1, h, w) for t, h, w in video_grid_thw.tolist() for _ in range(t)]


def rope_index(
    input_ids: torch.Tensor | Sequence[int],
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    video_token_id: int,
    spatial_merge_size: int,
) -> tuple[torch.Tensor, int]:
    """One prompt's ids -> ((3, 1, T) long positions, rope delta)."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)  # (T,)
    grids = {
        IMAGE: iter([] if image_grid_thw is None else [tuple(g) for g in image_grid_thw.tolist()]),
        VIDEO: iter(per_frame_grids(video_grid_thw)),
    }
    m = spatial_merge_size
    parts, start, at = [], 0, 0
    for kind, run in groupby(token_types(ids, image_token_id, video_token_id).tolist()):
        length = len(list(run))
        if kind == TEXT:
            parts.append(torch.arange(length).view(1, -1).expand(3, -1) + start)
            start += length
        else:
            name = "image" if kind == IMAGE else "video"
            grid = next(grids[kind], None)
            if grid is None:
                raise EngineError(f"the prompt has more runs of {name} tokens than {name} grids")
            t, h, w = grid[0], grid[1] // m, grid[2] // m
            if t * h * w != length:
                raise EngineError(
                    f"a run of {length} {name} tokens at position {at} does not match its grid {list(grid)} "
                    f"({t * h * w} tokens after the {m}x{m} merge)"
                )
            tt, hh, ww = torch.meshgrid(
                torch.arange(t), torch.arange(h) + start, torch.arange(w) + start, indexing="ij"
            )
            block = torch.stack([tt, hh, ww]).reshape(3, -1)  # (3, t*h*w)
            block[0] += start
            parts.append(block)
            start += max(h, w)
        at += length
    for kind, name in ((IMAGE, "image"), (VIDEO, "video")):
        if next(grids[kind], None) is not None:
            raise EngineError(f"more {name} grids than runs of {name} tokens in the prompt")
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)  # (3, T)
    delta = int(positions.max()) + 1 - ids.numel() if ids.numel() else 0
    return positions.view(3, 1, -1), delta


def mrope_angles(positions: torch.Tensor, freqs: torch.Tensor, section: Sequence[int]) -> torch.Tensor:
    """(3, T) positions -> (T, head_dim/2) angles, interleaved by ``section``."""
    angles = positions.float()[..., None] * freqs  # (3, T, hd/2)
    out = angles[0].clone()
    for row in (1, 2):
        sel = slice(row, section[row] * 3, 3)
        out[..., sel] = angles[row, ..., sel]
    return out


def rope_rows(
    positions: torch.Tensor, cfg: TextConfig, section: Sequence[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, T) positions -> cos and signed sin, (T, head_dim) each, for the text tower."""
    freqs = inv_freq(cfg.head_dim, cfg.rope_theta, positions.device)
    return rotary(mrope_angles(positions, freqs, section), dtype)
