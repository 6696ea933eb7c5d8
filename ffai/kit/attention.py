"""Causal attention of a text tower over its static KV cache, for every engine: the three shapes a
step can have (one new token, a prefill from position 0, a chunk after earlier positions), each
as one ``scaled_dot_product_attention`` call. Imports torch: only the towers use it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, gqa: bool) -> torch.Tensor:
    """(B, H, T, hd) queries for the last T of ``end`` positions over (B, Hkv, end, hd) keys and
    values -> (B, H, T, hd)."""
    t, end = q.shape[2], k.shape[2]
    if t == 1:  # one new token sees every cached position
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    if t == end:  # a prefill from position 0: plain causal
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    # A chunk after earlier positions: query i sits at end - t + i, causal mask aligned bottom-right.
    mask = torch.ones(t, end, dtype=torch.bool, device=q.device).tril(diagonal=end - t)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
