"""The SigLIP-style vision tower of Idefics3.

Follows transformers' ``Idefics3VisionTransformer`` (``modeling_idefics3.py``): patch
embedding + NaViT-style bucketized position ids for padded / non-square tiles, pre-norm encoder
layers (q/k/v with bias, attention scale ``head_dim**-0.5`` applied inside SDPA, tanh-GELU MLP),
and a final ``post_layernorm``. Padded patches are masked out as keys only, like the reference.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ffai.kit.linears import FusedLinear, embedding_table
from ffai.kit.precision import EXACT_ATTENTION
from ffai.kit.precision import VisionAttention as Attention

from .config import VisionConfig


def patch_mask(pixel_attention_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(N, H, W) pixel mask -> (N, H//p, W//p) bool: a patch is real if any of its pixels is.

    Trailing pixels that do not fill a patch are ignored, as by the conv and the reference's unfold.
    """
    n, h, w = pixel_attention_mask.shape
    h, w = h // patch_size * patch_size, w // patch_size * patch_size
    grid = pixel_attention_mask[:, :h, :w].reshape(n, h // patch_size, patch_size, w // patch_size, patch_size)
    return grid.to(torch.bool).any(dim=4).any(dim=2)


def position_ids(mask: torch.Tensor, patches_per_side: int) -> torch.Tensor:
    """(N, h, w) patch mask -> (N, h*w) position ids into the ``patches_per_side``² table.

    The real patches of each tile are spread over the whole table by bucketizing their fractional
    coordinates (so a half-height tile uses every other row). Padded patches get id 0. Computed
    with the reference's float32 steps so every id agrees exactly.
    """
    n, h, w = mask.shape
    device = mask.device
    boundaries = torch.arange(1 / patches_per_side, 1.0, 1 / patches_per_side, device=device)
    rows = mask[:, :, 0].sum(dim=1)  # (N,) real patch rows
    cols = mask[:, 0, :].sum(dim=1)  # (N,) real patch columns
    frac_h = torch.arange(h, device=device, dtype=torch.float32)[None, :] * (1.0 / rows)[:, None]
    frac_w = torch.arange(w, device=device, dtype=torch.float32)[None, :] * (1.0 / cols)[:, None]
    bucket_h = torch.bucketize(frac_h.clamp(max=1.0 - 1e-6), boundaries, right=True)  # (N, h)
    bucket_w = torch.bucketize(frac_w.clamp(max=1.0 - 1e-6), boundaries, right=True)  # (N, w)
    ids = bucket_h[:, :, None] * patches_per_side + bucket_w[:, None, :]  # (N, h, w)
    return torch.where(mask.reshape(n, -1), ids.reshape(n, -1), 0)  # (N, h*w)


class VisionEmbeddings(nn.Module):
    """Follows transformers' ``Idefics3VisionEmbeddings``."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = embedding_table(cfg.num_patches, cfg.hidden_size)

    def forward(self, pixels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels)  # (N, D, h, w)
        # (N, h*w, D), made contiguous: as the conv leaves it (D-major), every residual add would
        # keep that layout and every LayerNorm copy it again, 25 copies a tile. The same values.
        x = x.flatten(2).transpose(1, 2).contiguous()
        return x + self.position_embedding(position_ids(mask, self.cfg.patches_per_side))


class VisionAttention(nn.Module):
    """Follows transformers' ``Idefics3VisionAttention`` (SigLIP): bidirectional, biased
    projections, q/k/v as one matmul; attending as ``attention`` says (the precision plan's)."""

    def __init__(self, cfg: VisionConfig, attention: Attention = EXACT_ATTENTION) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.n_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = FusedLinear(d, (d, d, d), bias=True)
        self.out_proj = nn.Linear(d, d)
        # dtype None: the activations' own (float32's exact path); block None: torch's SDPA, else
        # blocks of that many query rows (blocked_attention).
        self.attention_dtype, self.attention_block = attention

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        n, t, _ = x.shape
        # A layer that computes in bfloat16 anyway takes and gives bfloat16 when attention is in
        # bfloat16: the same values, two casts of the tile's q/k/v fewer.
        bf16 = self.attention_dtype == torch.bfloat16
        qkv = self.qkv(x.to(torch.bfloat16) if bf16 and _in_bf16(self.qkv) else x)  # (N, T, 3 D)
        if self.attention_dtype is not None:
            qkv = qkv.to(self.attention_dtype)  # one cast for q, k and v together
        q, k, v = qkv.chunk(3, dim=-1)  # (N, T, D) each
        q = q.view(n, t, self.n_heads, self.head_dim).transpose(1, 2)  # (N, H, T, hd)
        k = k.view(n, t, self.n_heads, self.head_dim).transpose(1, 2)  # (N, H, T, hd)
        v = v.view(n, t, self.n_heads, self.head_dim).transpose(1, 2)  # (N, H, T, hd)
        if self.attention_block is not None:
            y = blocked_attention(q, k, v, key_mask, self.head_dim**-0.5, self.attention_block)  # (N, T, D)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, scale=self.head_dim**-0.5)
            y = y.transpose(1, 2).reshape(n, t, -1)  # (N, T, D)
        return self.out_proj(y if _in_bf16(self.out_proj) else y.to(x.dtype)).to(x.dtype)


def _in_bf16(layer: nn.Module) -> bool:
    return getattr(layer, "computes_in_bfloat16", False)


def blocked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, scale: float, block: int
) -> torch.Tensor:
    """Softmax attention as two batched matmuls and a softmax per block of ``block`` query rows:
    (N, H, T, hd) q, k, v and an optional (N, 1, 1, T) bool key mask -> (N, T, H * hd).

    For bfloat16 on a CPU with AVX512_BF16 but no AMX, where torch's flash attention does not
    pack its bfloat16 blocks for oneDNN and runs no faster than float32 (``precision.vision_attention``).
    Plain bfloat16 matmuls do run on oneDNN's native kernels. The whole score matrix
    (12 x 1024 x 1024) would be written and read back from memory by every step after it; a
    block of 128 query rows keeps its scores (3 MB in bfloat16) in cache (docs/benchmarks.md has
    the figures). The softmax reads bfloat16 scores and sums in float32; q is scaled before its
    product, as SDPA scales. Padded keys get -inf."""
    n, h, t, hd = q.shape
    q = (q * scale).contiguous()
    keys = k.transpose(2, 3).contiguous()  # (N, H, hd, T)
    v = v.contiguous()
    out = torch.empty(n, h, t, hd, dtype=q.dtype, device=q.device)
    hidden = None if key_mask is None else key_mask.logical_not()  # (N, 1, 1, T): True where padded
    for start in range(0, t, block):
        rows = slice(start, start + block)
        scores = torch.matmul(q[:, :, rows], keys)  # (N, H, block, T)
        if hidden is not None:
            scores.masked_fill_(hidden, float("-inf"))
        torch.matmul(scores.softmax(-1), v, out=out[:, :, rows])
    return out.transpose(1, 2).reshape(n, t, h * hd)


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # An opt-in layer that can fuse the GELU into its matmul does (PackedBf16Linear: a
        # tile's GELU pass and two casts saved, docs/precision-and-speed.md); else GELU in place
        # on fc1's output (the same kernel, so the same values): one 1024 x 3072 activation per
        # tile instead of two at a time.
        fused = getattr(self.fc1, "gelu_tanh", None)
        if fused is not None:
            return self.fc2(fused(x))
        return self.fc2(torch.ops.aten.gelu_(self.fc1(x), approximate="tanh"))


class EncoderLayer(nn.Module):
    """Follows transformers' ``Idefics3EncoderLayer``: pre-LayerNorm attention and MLP, each residual."""

    def __init__(self, cfg: VisionConfig, attention: Attention = EXACT_ATTENTION) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = VisionAttention(cfg, attention)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), key_mask)
        return x.add_(self.mlp(self.layer_norm2(x)))  # x is this layer's own sum: added to in place


class VisionTransformer(nn.Module):
    """(N, C, H, W) tiles + (N, H/p, W/p) patch mask -> (N, H/p * W/p, D) patch features; every
    layer attends as ``attention`` says."""

    def __init__(self, cfg: VisionConfig, attention: Attention = EXACT_ATTENTION) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = VisionEmbeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg, attention) for _ in range(cfg.num_layers))
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(
        self, pixels: torch.Tensor, mask: torch.Tensor, tile_input: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Tile by tile: a tile's features depend on that tile alone, and one at a time they come
        out bit for bit as from the whole batch at once (tests/test_smolvlm_model.py), as
        fast, with a 1/N share of the activations: an 8-frame window or a 17-tile still no longer
        holds every tile's 1024 x 3072 MLP activations at the same time. ``tile_input`` makes a
        slice of ``pixels`` (uint8 tiles, say) the tower's input, one tile at a time."""
        tile_input = tile_input or (lambda tile: tile)
        # Without padding no mask at all, so SDPA takes the same unmasked path as the reference;
        # with padding anywhere in the batch, every tile takes the masked path, as there.
        masked = not bool(mask.all())
        n = pixels.shape[0]
        if n == 0:
            return self.post_layernorm(self.embeddings(tile_input(pixels), mask))  # (0, T, D)
        out = None  # (N, T, D), allocated once the first tile gives T and D
        for i in range(n):
            tile_mask = mask[i : i + 1]
            x = self.embeddings(tile_input(pixels[i : i + 1]), tile_mask)  # (1, T, D)
            key_mask = tile_mask.reshape(1, 1, 1, -1) if masked else None  # (1, 1, 1, T)
            for layer in self.layers:
                x = layer(x, key_mask)
            x = self.post_layernorm(x)
            # One block for every tile's features, not one per tile between the next tile's
            # activations: those pinned the heap, which grew by a tile's working set per tile.
            out = x.new_empty((n, *x.shape[1:])) if out is None else out
            out[i] = x[0]
        return out
