"""The Llama text tower of Idefics3, with a preallocated KV cache written by position.

Follows transformers' ``LlamaModel`` / ``LlamaForCausalLM`` where it decides float equality:
RMSNorm computed in float32 then cast back before the weight; rotate-half RoPE with
``inv_freq = 1 / theta**(arange(0, hd, 2) / hd)`` and cos/sin built in float32 from the
positions; RoPE on q and k, keys and values cached after RoPE; the scale ``head_dim**-0.5``
applied inside SDPA; GQA by key/value head groups; SiLU-gated MLP.

The cache follows gpt-fast: one tensor pair per layer, sized once, written at ``input_pos``.
Unlike gpt-fast, attention reads only the filled prefix ``[:end]`` (no full-length mask), which
is both cheaper on CPU and the same arithmetic as the reference's growing cache.

Work the reference repeats and we do once: q/k/v and gate/up each run as one matmul
(``layers.FusedLinear``: the same dot products, so bit-identical), the RoPE cos/sin rows come
from a table built once per model, and a contiguous run of positions is written to the cache by
slice instead of by index (tests/test_smolvlm_fast_paths.py checks each against the plain way).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ffai.kit.attention import causal_attention
from ffai.kit.norms import RMSNorm

from .config import TextConfig
from .layers import FusedLinear, Linear, embedding_table

# Cache lengths are rounded up to a multiple of this, so requests of similar lengths share one.
CACHE_STEP = 256


class KVCache:
    """Keys and values for every layer: (B, kv_heads, max_len, head_dim) each, filled by position."""

    def __init__(self, cfg: TextConfig, batch: int, max_len: int, dtype: torch.dtype, device) -> None:
        shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        # Plain tensors even when first used under torch.inference_mode, so a later call outside
        # it can still write into them.
        with torch.inference_mode(False):
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    def fits(self, batch: int, length: int, dtype: torch.dtype, device) -> bool:
        return (
            self.batch == batch
            and self.max_len >= length
            and self.dtype == dtype
            and self.device == torch.device(device)
        )

    def update(self, layer: int, pos: torch.Tensor | slice, k: torch.Tensor, v: torch.Tensor, end: int):
        """Write (B, kv_heads, T, hd) at positions ``pos`` (ids or a slice); return the prefix ``[:end]``."""
        self.k[layer][:, :, pos] = k
        self.v[layer][:, :, pos] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """(T,) positions -> cos and signed sin of shape (T, head_dim), as transformers' default Llama
    RoPE, except that the sin's first half is negated for :func:`apply_rope`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device) / head_dim))
    freqs = pos.float()[:, None] * inv_freq  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd): rotate-half layout, not interleaved
    sin = emb.sin()
    sin[:, : head_dim // 2].neg_()  # negation is exact: (-s) * x == s * (-x) bit for bit
    return emb.cos().to(dtype), sin.to(dtype)


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
    With the sign in ``sin`` (``rope_cos_sin``), rotate_half is one roll, cat(x2, x1): the same
    products and sum, so the same bits, with one op instead of three."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


class Attention(nn.Module):
    """Follows transformers' ``LlamaAttention`` (GQA, RoPE, causal), with q/k/v as one matmul.
    With ``prefill_dtype`` (the precision plan's ``text_prefill``), several rows attend in that
    dtype, one decode row in the activations' own."""

    def __init__(self, cfg: TextConfig, layer: int, prefill_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.prefill_dtype = prefill_dtype
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self.qkv = FusedLinear(cfg.hidden_size, (q_size, kv_size, kv_size), bias=cfg.attention_bias)
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(
        self, x: torch.Tensor, rope: tuple, pos: torch.Tensor | slice, cache: KVCache | None, end: int
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        qkv = self.qkv.forward(x).view(b, t, h + 2 * kv, hd)  # (B, T, H + 2 Hkv, hd)
        # q and k sit side by side, so one RoPE call covers both (elementwise: same bits).
        q, k = apply_rope(qkv[:, :, : h + kv].transpose(1, 2), *rope).split([h, kv], dim=1)  # (B, H | Hkv, T, hd)
        v = qkv[:, :, h + kv :].transpose(1, 2)  # (B, Hkv, T, hd)
        if cache is not None:
            k, v = cache.update(self.layer, pos, k, v, end)  # (B, Hkv, end, hd)
        y = self._attend(q, k, v)
        y = y.transpose(1, 2).reshape(b, t, -1)  # (B, T, H*hd)
        return self.o_proj.forward(y)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        low = self.prefill_dtype
        if low is not None and q.shape[2] > 1 and q.dtype != low:
            y = causal_attention(q.to(low), k.to(low), v.to(low), self.head_dim**-0.5, self.n_heads != self.n_kv)
            return y.to(q.dtype)
        return causal_attention(q, k, v, self.head_dim**-0.5, self.n_heads != self.n_kv)


class MLP(nn.Module):
    """Follows transformers' ``LlamaMLP``: down(silu(gate(x)) * up(x)), with gate/up as one matmul."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up = FusedLinear(cfg.hidden_size, (size, size), bias=cfg.mlp_bias)
        self.down_proj = Linear(size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up.forward(x).chunk(2, dim=-1)  # (B, T, I) each
        return self.down_proj.forward(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Follows transformers' ``LlamaDecoderLayer``: pre-RMSNorm attention and MLP, each residual."""

    def __init__(self, cfg: TextConfig, layer: int, prefill_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, prefill_dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, rope: tuple, pos: torch.Tensor | slice, cache: KVCache | None, end: int
    ) -> torch.Tensor:
        x = x + self.self_attn.forward(self.input_layernorm.forward(x), rope, pos, cache, end)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class TextModel(nn.Module):
    """Embeddings in, logits out: (B, T, D) at positions ``pos`` (T,) -> (B, T, vocab).

    ``cache=None`` recomputes attention over the given tokens only (they must start at 0);
    with a cache, the tokens' keys/values are written at ``pos`` and attend to everything before.
    ``last_only`` projects only the final position to the vocabulary (all generation needs).
    The tower keeps one cache for generation (``reserve_cache``), reused from request to request.

    Inside the tower each part is called through its ``forward``, not ``nn.Module.__call__``:
    the call's hook dispatch cost about 5 µs here and a decode step made some 270 such calls,
    a tenth of an int8 step. Nothing hooks the parts; the tower's own call (which profilers
    hook) is a normal one.
    """

    def __init__(self, cfg: TextConfig, tie_word_embeddings: bool, prefill_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = embedding_table(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, prefill_dtype) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope: RopeTable | None = None  # built on first use (the weights decide dtype and device)
        self.cache: KVCache | None = None  # allocated by the first reserve_cache
        self.compiled_decode = None  # compiled_decode.CompiledDecode where the runtime asks for it

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache | None = None, *, last_only: bool = False
    ) -> torch.Tensor:
        # Positions are read once here, not per layer (on a GPU each read is a sync).
        first, end = int(pos[0]), int(pos[-1]) + 1
        if end - first == pos.shape[0]:  # a contiguous run, the only kind generation makes
            rope, slot = self._rope_rows(first, end, x), slice(first, end)
        else:
            rope, slot = rope_cos_sin(pos, self.cfg.head_dim, self.cfg.rope_theta, x.dtype), pos
        for layer in self.layers:
            x = layer.forward(x, rope, slot, cache, end)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        return self.lm_head.forward(self.norm.forward(x))

    def _rope_rows(self, start: int, end: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope is None or not self.rope.fits(end, x.dtype, x.device):
            length = max(end, self.cfg.max_position_embeddings)
            self.rope = RopeTable(length, self.cfg.head_dim, self.cfg.rope_theta, x.dtype, x.device)
        return self.rope.rows(start, end)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A cache of its own for the caller (the tower's own one is ``reserve_cache``'s)."""
        w = self.norm.weight  # the residual stream's dtype: the embeddings' (a table may be left in its file)
        return KVCache(self.cfg, batch, max_len, w.dtype, w.device)

    def reserve_cache(self, batch: int, length: int) -> KVCache:
        """The tower's cache, with room for ``length`` positions of ``batch`` sequences.

        Allocated on first use and replaced only when a request does not fit, by one rounded up to
        ``CACHE_STEP`` positions (at most the context), so a worker decoding window after window
        allocates it once or twice. Earlier contents are never read: attention sees ``[:end]``,
        which a request writes before it reads.
        """
        w = self.norm.weight
        if self.cache is None or not self.cache.fits(batch, length, w.dtype, w.device):
            size = min(-(-length // CACHE_STEP) * CACHE_STEP, self.cfg.max_position_embeddings)
            self.cache = self.new_cache(batch, max(size, length))
        return self.cache
