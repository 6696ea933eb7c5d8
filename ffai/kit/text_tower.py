"""The text tower every engine runs: a decoder-only transformer (Llama's, with Qwen3's per-head
q/k RMSNorm as an option) over a preallocated KV cache written by position.

Follows transformers' ``LlamaModel`` / ``LlamaForCausalLM`` and ``Qwen3VLTextModel`` where they
decide float equality: RMSNorm computed in float32 then cast back before the weight; with
``qk_norm``, q and k normalised per head before RoPE; RoPE on q and k, keys and values cached
after RoPE; the scale ``head_dim**-0.5`` applied inside SDPA; GQA by key/value head groups; a
SiLU-gated MLP. After each of its first layers a prompt may add features at some positions
(``inject``, Qwen3-VL's DeepStack).

The cache follows gpt-fast: one tensor pair per layer, sized once, written at the positions.
Attention reads only the filled prefix ``[:end]`` (no full-length mask): cheaper on a CPU, and
the same arithmetic as the reference's growing cache.

What the reference repeats is done once here: q/k/v and gate/up each run as one matmul
(``linears.FusedLinear``: the same dot products, so bit-identical), the RoPE rows come from a
table built once per tower (``rope.RopeTable``), and a run of positions is written to the cache
by slice. Inside the tower each part is called through its ``forward``, not
``nn.Module.__call__``, whose hook dispatch a decode step would pay a few hundred times
(docs/benchmarks.md); nothing hooks the parts, and the tower's own call is a normal one.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ffai.kit.attention import causal_attention
from ffai.kit.linears import FusedLinear, Linear, embedding_table
from ffai.kit.norms import RMSNorm
from ffai.kit.rope import RopeTable, apply_rope
from ffai.kit.text_config import TextConfig

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

    def update(self, layer: int, slot: slice, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, kv_heads, T, hd) at ``slot``; return the filled prefix ``[:slot.stop]``."""
        self.k[layer][:, :, slot] = k
        self.v[layer][:, :, slot] = v
        return self.k[layer][:, :, : slot.stop], self.v[layer][:, :, : slot.stop]


class Attention(nn.Module):
    """Follows ``LlamaAttention`` (GQA, RoPE, causal) and, with ``qk_norm``, ``Qwen3VLTextAttention``
    (q and k RMS-normalised per head), with q/k/v as one matmul. With ``prefill_dtype`` (a precision
    plan's ``text_prefill``) several rows attend in that dtype, one decode row in the activations'
    own. A cache narrower than the activations (a plan's ``kv_cache``) is read by later steps only:
    a prefill from position 0 attends over its own keys as computed."""

    def __init__(self, cfg: TextConfig, layer: int, prefill_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.prefill_dtype = prefill_dtype
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self.qkv = FusedLinear(cfg.hidden_size, (q_size, kv_size, kv_size), bias=cfg.attention_bias)
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, rope: tuple, slot: slice, cache: KVCache | None) -> torch.Tensor:
        b, t, _ = x.shape
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        qkv = self.qkv.forward(x).view(b, t, h + 2 * kv, hd)  # (B, T, H + 2 Hkv, hd)
        if self.q_norm is None:
            # q and k sit side by side, so one RoPE call covers both (elementwise: same bits).
            q, k = apply_rope(qkv[:, :, : h + kv].transpose(1, 2), *rope).split([h, kv], dim=1)  # (B, H | Hkv, T, hd)
        else:
            q = apply_rope(self.q_norm.forward(qkv[:, :, :h]).transpose(1, 2), *rope)  # (B, H, T, hd)
            k = apply_rope(self.k_norm.forward(qkv[:, :, h : h + kv]).transpose(1, 2), *rope)  # (B, Hkv, T, hd)
        v = qkv[:, :, h + kv :].transpose(1, 2)  # (B, Hkv, T, hd)
        if cache is not None:
            cached = cache.update(self.layer, slot, k, v)  # (B, Hkv, end, hd)
            if slot.start != 0 or cached[0].dtype == k.dtype:
                k, v = cached
        y = self._attend(q, k, v).to(x.dtype)  # (B, H, T, hd)
        return self.o_proj.forward(y.transpose(1, 2).reshape(b, t, -1))  # (B, T, H*hd) in

    def forward_rows(self, x: torch.Tensor, rope: tuple, rows: Sequence[tuple[KVCache, int]]) -> torch.Tensor:
        """One decode step of several sequences: (B, 1, D) with row b at slot ``rows[b][1]`` of its
        own cache ``rows[b][0]`` (its ``rope`` rows (B, 1, 1, hd)). The projections run once for
        all rows; each row attends over its own cache."""
        b = x.shape[0]
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        qkv = self.qkv.forward(x).view(b, 1, h + 2 * kv, hd)
        if self.q_norm is None:
            q, k = apply_rope(qkv[:, :, : h + kv].transpose(1, 2), *rope).split([h, kv], dim=1)
        else:
            q = apply_rope(self.q_norm.forward(qkv[:, :, :h]).transpose(1, 2), *rope)
            k = apply_rope(self.k_norm.forward(qkv[:, :, h : h + kv]).transpose(1, 2), *rope)
        v = qkv[:, :, h + kv :].transpose(1, 2)
        ys = []
        for i, (cache, slot) in enumerate(rows):
            keys, values = cache.update(self.layer, slice(slot, slot + 1), k[i : i + 1], v[i : i + 1])
            ys.append(self._attend(q[i : i + 1], keys, values))
        y = torch.cat(ys).to(x.dtype)  # (B, H, 1, hd)
        return self.o_proj.forward(y.transpose(1, 2).reshape(b, 1, -1))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        low, gqa = self.prefill_dtype, self.n_heads != self.n_kv
        if low is not None and q.shape[2] > 1 and q.dtype != low:
            return causal_attention(q.to(low), k.to(low), v.to(low), self.head_dim**-0.5, gqa)
        return causal_attention(q.to(k.dtype), k, v, self.head_dim**-0.5, gqa)


class MLP(nn.Module):
    """Follows ``LlamaMLP``: down(silu(gate(x)) * up(x)), with gate/up as one matmul."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up = FusedLinear(cfg.hidden_size, (size, size), bias=cfg.mlp_bias)
        self.down_proj = Linear(size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up.forward(x).chunk(2, dim=-1)  # (B, T, I) each
        return self.down_proj.forward(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Follows ``LlamaDecoderLayer``: pre-RMSNorm attention and MLP, each residual."""

    def __init__(self, cfg: TextConfig, layer: int, prefill_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, prefill_dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rope: tuple, slot: slice, cache: KVCache | None) -> torch.Tensor:
        x = x + self.self_attn.forward(self.input_layernorm.forward(x), rope, slot, cache)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))

    def forward_rows(self, x: torch.Tensor, rope: tuple, rows: Sequence[tuple[KVCache, int]]) -> torch.Tensor:
        x = x + self.self_attn.forward_rows(self.input_layernorm.forward(x), rope, rows)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class TextModel(nn.Module):
    """Embeddings in, logits out: (B, T, D) at cache slots ``slot`` with RoPE rows ``rope`` ((T, hd)
    cos and signed sin, ``rope_rows``) -> (B, T, vocab).

    ``cache=None`` attends over the given tokens only (they must be a whole prompt); with a cache,
    their keys and values are written at ``slot`` and attend to everything before. ``inject`` is
    ``(mask (B, T) bool, [features (n, D), ...])``: feature i is added at the masked positions
    after layer i. ``last_only`` projects only the last position to the vocabulary (all generation
    needs). The tower keeps one cache for generation (``reserve_cache``), reused from request to
    request, and where the runtime asks for it a compiled decode step (``compiled_decode``).
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
        self.cache_dtype: torch.dtype | None = None  # None: the residual stream's; else the precision plan's
        self.compiled_decode = None  # ffai.kit.compiled_decode.CompiledDecode where the runtime asks for it

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        slot: slice,
        cache: KVCache | None = None,
        *,
        inject: tuple[torch.Tensor, list[torch.Tensor]] | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        mask, features = inject if inject is not None else (None, ())
        for i, layer in enumerate(self.layers):
            x = layer.forward(x, rope, slot, cache)
            if i < len(features):
                x[mask] = x[mask] + features[i].to(x.device, x.dtype)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        return self.lm_head.forward(self.norm.forward(x))

    def decode_rows(self, tokens: torch.Tensor, rows: Sequence[tuple[KVCache, int, int]]) -> torch.Tensor:
        """One decode step of several sequences at once: (B,) token ids, row b written at slot
        ``rows[b][1]`` of its own cache ``rows[b][0]`` at rotary position ``rows[b][2]`` -> (B, vocab)
        logits. Every linear reads its weight once for all rows (the step's cost on a CPU is that
        read); attention is each row's own."""
        x = self.embed(tokens[:, None])  # (B, 1, D)
        positions = [position for _, _, position in rows]
        self.rope_rows(0, max(positions) + 1)  # the table covers them all
        index = torch.tensor(positions, device=self.device)
        cos, sin = (t.index_select(0, index)[:, None, None] for t in (self.rope.cos, self.rope.sin))
        slots = [(cache, slot) for cache, slot, _ in rows]
        for layer in self.layers:
            x = layer.forward_rows(x, (cos, sin), slots)
        return self.lm_head.forward(self.norm.forward(x))[:, -1]

    @property
    def dtype(self) -> torch.dtype:
        """The residual stream's dtype: the norms' (float32 also where linears are bfloat16)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, D) rows of the table, in the residual stream's dtype."""
        return self.embed_tokens(ids.to(self.device)).to(self.dtype)

    def rope_rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The plain RoPE rows of positions [start, end), (end - start, head_dim) each."""
        if self.rope is None or not self.rope.fits(end, self.dtype, self.device):
            length = max(end, min(self.cfg.max_position_embeddings, ROPE_TABLE_ROWS))
            self.rope = RopeTable(length, self.cfg.head_dim, self.cfg.rope_theta, self.dtype, self.device)
        return self.rope.rows(start, end)

    def cache_bytes(self, batch: int, max_len: int) -> int:
        """What ``new_cache(batch, max_len)`` allocates, in bytes."""
        cfg, dtype = self.cfg, self.cache_dtype or self.dtype
        per_layer = 2 * batch * cfg.num_key_value_heads * max_len * cfg.head_dim
        return per_layer * cfg.num_hidden_layers * torch.empty((), dtype=dtype).element_size()

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """A cache of its own for the caller (the tower's own one is ``reserve_cache``'s)."""
        return KVCache(self.cfg, batch, max_len, self.cache_dtype or self.dtype, self.device)

    def reserve_cache(self, batch: int, length: int) -> KVCache:
        """The tower's cache, with room for ``length`` positions of ``batch`` sequences.

        Allocated on first use and replaced only when a request does not fit, by one rounded up to
        ``CACHE_STEP`` positions (at most the context), so a worker decoding window after window
        allocates it once or twice. Earlier contents are never read: attention sees ``[:end]``,
        which a request writes before it reads.
        """
        dtype = self.cache_dtype or self.dtype
        if self.cache is None or not self.cache.fits(batch, length, dtype, self.device):
            size = min(-(-length // CACHE_STEP) * CACHE_STEP, self.cfg.max_position_embeddings)
            self.cache = self.new_cache(batch, max(size, length))
        return self.cache


# The RoPE table's rows at first: the whole context of a small model; a long context's table
# grows to the positions asked for (its rows do not depend on its length).
ROPE_TABLE_ROWS = 8192
