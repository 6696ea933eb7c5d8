"""The Qwen3-VL vision tower: patches in, merged tokens and DeepStack features out.

Follows transformers 5.24's ``Qwen3VLVisionModel``: a Conv3d patch embedding (kernel = stride, so
each flattened patch of the processor is one output row), learned position embeddings bilinearly
resampled to each grid (``get_vision_interpolation_indices_and_weights``, align_corners, in the
processor's merge-block order), a 2D rotary over (row, column), pre-LayerNorm blocks whose
attention stays inside one image or one frame pair (``cu_seqlens``), the patch merger (LayerNorm,
then 2x2 patches concatenated into one token, then an MLP) and, after the blocks listed in
``deepstack_visual_indexes``, DeepStack mergers (the same merge, normalised after concatenating).

The patch embedding stays a convolution: a linear over the flattened patch is the same sum in
another order, which is not the reference's rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ffai.kit.linears import Linear
from ffai.kit.precision import EXACT_ATTENTION, VisionAttention
from ffai.kit.rope import apply_rope, inv_freq, rotary

from .config import VisionConfig


def interpolation(grid_thw: torch.Tensor, side: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 3) grids -> (N, 4) indices into the side x side table and their (N, 4) bilinear weights,
    one row per patch in merge-block order, as the reference's ``align_corners`` bilinear resampling."""
    indices, weights = [], []
    for t, h, w in grid_thw.tolist():
        # Within a frame, patch k is block (k // m^2) of the (h/m, w/m) blocks, cell k % m^2 inside it.
        k = torch.arange(h * w)
        col = (k // (merge * merge)) % (w // merge) * merge + k % merge
        row = k // (merge * merge * (w // merge)) * merge + (k // merge) % merge
        h_taps, h_weights = _axis(row, h, side)
        w_taps, w_weights = _axis(col, w, side)
        indices.append((h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4).repeat(t, 1))
        weights.append((h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4).repeat(t, 1))
    return torch.cat(indices), torch.cat(weights)


def _axis(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two taps per target position on an axis of ``size`` into a ``side``-long table, and their weights."""
    src = index.float() * (side - 1) / max(size - 1, 1)  # endpoints map to 0 and side - 1
    floor = torch.floor(src)
    offsets = torch.arange(0, 2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def rotary_positions(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """(n, 3) grids -> (N, 2) (row, column) of each patch, in merge-block order, repeated per frame pair."""
    out = []
    for t, h, w in grid_thw.tolist():
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        blocks = (h // merge, merge, w // merge, merge)
        rows = rows.reshape(blocks).transpose(1, 2).flatten()
        cols = cols.reshape(blocks).transpose(1, 2).flatten()
        out.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
    return torch.cat(out)


def segment_lengths(grid_thw: torch.Tensor) -> list[int]:
    """Patches per attention segment: one segment per image or frame pair."""
    return [h * w for t, h, w in grid_thw.tolist() for _ in range(t)]


class PatchEmbed(nn.Module):
    """Follows ``Qwen3VLVisionPatchEmbed``: one Conv3d whose kernel is its stride."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.in_channels, self.dim = cfg.num_channels, cfg.hidden_size
        self.proj = nn.Conv3d(cfg.num_channels, cfg.hidden_size, self.kernel, stride=self.kernel, bias=True)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.view(-1, self.in_channels, *self.kernel)  # (N, C, Tp, P, P)
        w = self.proj.weight
        y = F.conv3d(x.to(w.dtype), w, self.proj.bias, stride=self.kernel)  # (N, D, 1, 1, 1)
        return y.view(-1, self.dim).to(pixels.dtype)  # (N, D)


class Attention(nn.Module):
    """Follows ``Qwen3VLVisionAttention`` with SDPA: q/k/v from one linear, 2D rotary in float32,
    then one SDPA call per segment (no mask; a patch sees its own image or frame pair only)."""

    def __init__(self, cfg: VisionConfig, attention_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = Linear(cfg.hidden_size, cfg.hidden_size, bias=True)
        self.attention_dtype = attention_dtype  # None: the activations'; else the precision plan's

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lengths: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.heads, -1).permute(1, 0, 2, 3).unbind(0)  # (N, H, hd) each
        cos, sin = rope  # (N, 1, hd)
        v = v.to(self.attention_dtype or v.dtype)
        q = apply_rope(q.float(), cos, sin).to(v.dtype)
        k = apply_rope(k.float(), cos, sin).to(v.dtype)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1, H, N, hd)
        scale = self.head_dim**-0.5
        outs = [
            F.scaled_dot_product_attention(qs, ks, vs, scale=scale).transpose(1, 2)  # (1, len, H, hd)
            for qs, ks, vs in zip(q.split(lengths, dim=2), k.split(lengths, dim=2), v.split(lengths, dim=2))
        ]
        y = torch.cat(outs, dim=1).reshape(n, -1)  # (N, D)
        return self.proj(y.to(x.dtype))


class MLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class Block(nn.Module):
    """Follows ``Qwen3VLVisionBlock``: pre-LayerNorm attention and MLP, each residual."""

    def __init__(self, cfg: VisionConfig, attention_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = Attention(cfg, attention_dtype)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], lengths: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Follows ``Qwen3VLVisionPatchMerger``: m x m neighbouring patches (consecutive rows, as the
    processor orders them) become one token of the text tower's width. The main merger normalises
    each patch before concatenating; DeepStack's (``postshuffle``) normalise the concatenation."""

    def __init__(self, cfg: VisionConfig, postshuffle: bool) -> None:
        super().__init__()
        self.width = cfg.hidden_size * cfg.merge_unit
        self.postshuffle = postshuffle
        self.norm = nn.LayerNorm(self.width if postshuffle else cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = Linear(self.width, self.width, bias=True)
        self.linear_fc2 = Linear(self.width, cfg.out_hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.width) if self.postshuffle else x).view(-1, self.width)  # (N/m^2, m^2 D)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionModel(nn.Module):
    """(N, patch values) pixels + (n, 3) grids -> (N/m^2, text D) tokens and one (N/m^2, text D)
    DeepStack feature per entry of ``deepstack_visual_indexes``; attending as ``attention`` says
    (the precision plan's: its dtype; Qwen3-VL's blocks never attend by blocks of rows)."""

    def __init__(self, cfg: VisionConfig, attention: VisionAttention = EXACT_ATTENTION) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        table = torch.empty(cfg.num_position_embeddings, cfg.hidden_size)  # the checkpoint fills it: no init
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size, _weight=table)
        self.blocks = nn.ModuleList(Block(cfg, attention.dtype) for _ in range(cfg.num_layers))
        self.merger = PatchMerger(cfg, postshuffle=False)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(cfg, postshuffle=True) for _ in cfg.deepstack_visual_indexes
        )

    def forward(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        cfg = self.cfg
        grid_thw = grid_thw.cpu()
        x = self.patch_embed(pixels)  # (N, D)
        idx, weights = interpolation(grid_thw, cfg.grid_side, cfg.spatial_merge_size)
        table = self.pos_embed.weight
        pos = (F.embedding(idx.to(table.device), table) * weights.to(table.device)[:, :, None]).sum(1)  # (N, D)
        x = x + pos.to(x.dtype)
        rope = self._rope(grid_thw, x.device)
        lengths = segment_lengths(grid_thw)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, rope, lengths)
            if i in cfg.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[cfg.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deepstack

    def _rope(self, grid_thw: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        pos = rotary_positions(grid_thw, self.cfg.spatial_merge_size).to(device)  # (N, 2)
        # The same frequencies for rows and columns, over half the head each.
        freqs = inv_freq(self.cfg.head_dim // 2, self.cfg.rope_theta, device)
        angles = pos[..., None].float() * freqs  # (N, 2, hd/4)
        cos, sin = rotary(torch.cat([angles[:, 0], angles[:, 1]], dim=-1), torch.float32)  # (N, hd)
        return cos[:, None], sin[:, None]  # (N, 1, hd): broadcast over heads
