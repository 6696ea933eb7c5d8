"""Rotary position embeddings as transformers computes them for a plain (1-D) RoPE, in the
rotate-half layout: cos and a signed sin per position, and one roll to apply them.

A family whose positions are not plain (Qwen3-VL's multimodal RoPE) makes its own angles and turns
them into rows with :func:`rotary`; every family applies them with :func:`apply_rope`.
"""

from __future__ import annotations

import torch


def inv_freq(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """(head_dim/2,) inverse frequencies, computed as the reference computes them."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))


def rotary(angles: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, half) angles -> cos and signed sin of shape (T, 2*half) in the rotate-half layout; the
    sin's first half is negated for :func:`apply_rope` (negation is exact)."""
    emb = torch.cat((angles, angles), dim=-1)  # (T, hd): rotate-half layout, not interleaved
    sin = emb.sin()
    sin[..., : angles.shape[-1]].neg_()
    return emb.cos().to(dtype), sin.to(dtype)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """(T,) positions -> cos and signed sin of shape (T, head_dim), as transformers' default
    RoPE, except that the sin's first half is negated for :func:`apply_rope`."""
    return rotary(pos.float()[:, None] * inv_freq(head_dim, theta, pos.device), dtype)  # (T, hd/2) angles


class RopeTable:
    """cos/sin rows for positions [0, length), computed once; rows are elementwise in the position,
    so a looked-up row equals ``rope_cos_sin`` of that position bit for bit."""

    def __init__(self, length: int, head_dim: int, theta: float, dtype: torch.dtype, device) -> None:
        self.cos, self.sin = rope_cos_sin(torch.arange(length, device=device), head_dim, theta, dtype)

    def fits(self, length: int, dtype: torch.dtype, device) -> bool:
        return self.cos.shape[0] >= length and self.cos.dtype == dtype and self.cos.device == torch.device(device)

    def rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[start:end], self.sin[start:end]  # (T, hd) each


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The reference's ``x * cos + rotate_half(x) * sin``, where rotate_half(x) = cat(-x2, x1).
    With the sign in ``sin`` (``rotary``), rotate_half is one roll, cat(x2, x1): the same
    products and sum, so the same bits, with one op instead of three."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin
