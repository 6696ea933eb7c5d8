"""The Qwen3 text tower of Qwen3-VL, with DeepStack and a preallocated KV cache written by position.

Follows transformers 5.24's ``Qwen3VLTextModel`` where it decides float equality: RMSNorm in
float32 then cast back before the weight; q and k normalised per head (``q_norm``/``k_norm`` over
head_dim) before RoPE; the rotary angles of ``rope.mrope_angles``; keys and values cached after
RoPE; the scale ``head_dim**-0.5`` inside SDPA, GQA by SDPA's ``enable_gqa`` (what transformers
passes on a CPU without a mask); a SiLU-gated MLP. After each of the first
``len(deepstack)`` layers the matching DeepStack feature is added to the hidden states at the
visual positions (``_deepstack_process``).

The cache follows gpt-fast: one tensor pair per layer, sized once, written at the positions;
attention reads only the filled prefix ``[:end]``, the same arithmetic as the reference's growing
cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ffai.kit.attention import causal_attention
from ffai.kit.norms import RMSNorm

from .config import TextConfig
from .layers import Linear
from .rope import apply_rope

# Cache lengths are rounded up to a multiple of this, so requests of similar lengths share one.
CACHE_STEP = 256


class KVCache:
    """Keys and values for every layer: (B, kv_heads, max_len, head_dim) each, filled by position."""

    def __init__(self, cfg: TextConfig, batch: int, max_len: int, dtype: torch.dtype, device) -> None:
        shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        # Plain tensors even when first made under torch.inference_mode, so later calls can write them.
        with torch.inference_mode(False):
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    def fits(self, batch: int, length: int, dtype: torch.dtype, device) -> bool:
        k = self.k[0]
        return k.shape[0] == batch and k.shape[2] >= length and k.dtype == dtype and k.device == torch.device(device)

    def update(self, layer: int, slot: slice, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, kv_heads, T, hd) at ``slot``; return the filled prefix ``[:slot.stop]``."""
        self.k[layer][:, :, slot] = k
        self.v[layer][:, :, slot] = v
        return self.k[layer][:, :, : slot.stop], self.v[layer][:, :, : slot.stop]


class Attention(nn.Module):
    """Follows ``Qwen3VLTextAttention`` (GQA, q/k RMSNorm, mRoPE, causal)."""

    def __init__(self, cfg: TextConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple, slot: slice, cache: KVCache | None) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q = self.q_norm(self.q_proj(x).view(b, t, -1, hd)).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_norm(self.k_proj(x).view(b, t, -1, hd)).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(b, t, -1, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            cached = cache.update(self.layer, slot, k, v)  # (B, Hkv, end, hd)
            # A prefill from position 0 attends over its own keys as computed; a cache narrower
            # than them (opt-in dtypes) is read only by later steps, in its dtype.
            if slot.start != 0 or cached[0].dtype == k.dtype:
                k, v = cached
        y = self._attend(q.to(k.dtype), k, v).to(x.dtype)  # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return causal_attention(q, k, v, self.head_dim**-0.5, self.heads != self.kv_heads)


class MLP(nn.Module):
    """Follows ``Qwen3VLTextMLP``: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Follows ``Qwen3VLTextDecoderLayer``: pre-RMSNorm attention and MLP, each residual."""

    def __init__(self, cfg: TextConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rope: tuple, slot: slice, cache: KVCache | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, slot, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    """Embeddings in, logits out: (B, T, D) at cache slots ``slot`` with rotary ``rope`` -> (B, T, vocab).

    ``cache=None`` attends over the given tokens only (they must be the whole prompt); with a cache
    their keys/values are written at ``slot`` and attend to everything before. ``deepstack`` is
    ``(mask (B, T) bool, [features (n_visual, D) per layer])``: feature i is added at the masked
    positions after layer i. ``last_only`` projects only the last position to the vocabulary.
    """

    def __init__(self, cfg: TextConfig, tie_word_embeddings: bool) -> None:
        super().__init__()
        self.cfg = cfg
        # Left uninitialised (the checkpoint fills it): no random init of a 151936-row table.
        table = torch.empty(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=table)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.cache: KVCache | None = None  # allocated by the first reserve_cache
        self.cache_dtype: torch.dtype | None = None  # None: the residual stream's; else the precision plan's

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        slot: slice,
        cache: KVCache | None = None,
        *,
        deepstack: tuple[torch.Tensor, list[torch.Tensor]] | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        mask, features = deepstack if deepstack is not None else (None, [])
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, slot, cache)
            if i < len(features):
                x[mask] = x[mask] + features[i].to(x.device, x.dtype)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        return self.lm_head(self.norm(x))

    @property
    def dtype(self) -> torch.dtype:
        """The residual stream's dtype (the norms': float32 also when linears are bfloat16)."""
        return self.norm.weight.dtype

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, D) rows of the table, in the residual stream's dtype."""
        return self.embed_tokens(ids).to(self.dtype)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A cache of its own for the caller (the tower's own one is ``reserve_cache``'s)."""
        return KVCache(self.cfg, batch, max_len, self.cache_dtype or self.dtype, self.norm.weight.device)

    def reserve_cache(self, batch: int, length: int) -> KVCache:
        """The tower's cache with room for ``length`` positions, allocated on first use and replaced
        only when a request does not fit (rounded up to ``CACHE_STEP``, at most the context). Earlier
        contents are never read: attention sees ``[:end]``, which a request writes before reading."""
        dtype, device = self.cache_dtype or self.dtype, self.norm.weight.device
        if self.cache is None or not self.cache.fits(batch, length, dtype, device):
            size = min(-(-length // CACHE_STEP) * CACHE_STEP, self.cfg.max_position_embeddings)
            self.cache = self.new_cache(batch, max(size, length))
        return self.cache
