"""The Llama text tower of Idefics3, with a preallocated KV cache written by position.

Follows transformers' ``LlamaModel`` / ``LlamaForCausalLM`` where it decides float equality:
RMSNorm computed in float32 then cast back before the weight; rotate-half RoPE with
``inv_freq = 1 / theta**(arange(0, hd, 2) / hd)`` and cos/sin built in float32 from the
positions; q/k/v projected separately, RoPE on q and k, keys and values cached after RoPE; the
scale ``head_dim**-0.5`` applied inside SDPA; GQA by key/value head groups; SiLU-gated MLP.

The cache follows gpt-fast: one tensor pair per layer, sized once, written at ``input_pos``.
Unlike gpt-fast, attention reads only the filled prefix ``[:end]`` (no full-length mask), which
is both cheaper on CPU and the same arithmetic as the reference's growing cache.

Work the reference repeats and we do once: q/k/v and gate/up each run as one matmul over a
fused weight (``fuse_linears``; the per-output-column dot products are unchanged, so the result
is bit-identical on MKL, checked by tests/test_smolvlm_fast_paths.py), the RoPE cos/sin rows come
from a table built once per model, and a contiguous run of positions is written to the cache by
slice instead of by index.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import TextConfig


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
            self.batch == batch and self.max_len >= length and self.dtype == dtype
            and self.device == torch.device(device)
        )

    def update(self, layer: int, pos: torch.Tensor | slice, k: torch.Tensor, v: torch.Tensor, end: int):
        """Write (B, kv_heads, T, hd) at positions ``pos`` (ids or a slice); return the prefix ``[:end]``."""
        self.k[layer][:, :, pos] = k
        self.v[layer][:, :, pos] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One (sum of out, in) weight (and bias) for linears that read the same input.

    Each linear's parameters become views into the fused tensors, so the separate weights (the
    checkpoint's names, ``state_dict``) stay valid and no memory is duplicated. When the weights
    already lie back to back in one buffer (``weights.load_model`` reads them so), that buffer is
    the fused tensor and nothing is copied.
    """
    weight = _joined([lin.weight for lin in linears])
    has_bias = linears[0].bias is not None
    bias = _joined([lin.bias for lin in linears]) if has_bias else None
    start = 0
    for lin in linears:
        end = start + lin.out_features
        lin.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if has_bias:
            lin.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``, or a view of their common buffer when they already lie in it in order."""
    first = parts[0].detach()
    offset, storage = first.storage_offset(), first.untyped_storage()
    adjacent = all(p.is_contiguous() and p.dtype == first.dtype for p in parts)
    for p in parts:
        adjacent = adjacent and p.untyped_storage().data_ptr() == storage.data_ptr() and p.storage_offset() == offset
        offset += p.numel()
    if not adjacent or offset > storage.nbytes() // first.element_size():
        return torch.cat([p.detach() for p in parts])
    rows = sum(p.shape[0] for p in parts)
    return first.new_empty(0).set_(storage, first.storage_offset(), (rows, *first.shape[1:]), first.stride())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, with a one-row input (a decode step) spread over torch's threads.

    torch runs a one-row float32 ``F.linear`` on one thread, which leaves a decode step's
    matrix-vector products at about half the memory bandwidth two cores have. Here the weight's
    output rows are cut into one block per thread and ``bmm`` computes the blocks in parallel:
    every output is the same dot product by the same kernel, so the result is bit for bit
    ``F.linear``'s (tests/test_smolvlm_fast_paths.py); measured on 2 cores, the 121 products
    of a SmolVLM-256M decode step take 34 ms instead of 54 ms. Small blocks (fewer than 64 rows
    or columns) take other kernels, whose sums may round differently: those stay on F.linear.
    """
    p = torch.get_num_threads()
    n, k = weight.shape
    if (
        p > 1 and bias is None and x.numel() == k and n % p == 0 and n // p >= 64 and k >= 64 and weight.is_contiguous()
        and x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu"
    ):
        blocks = weight.view(p, n // p, k).transpose(1, 2)  # (p, k, n / p)
        return torch.bmm(x.reshape(1, 1, k).expand(p, 1, k), blocks).view(*x.shape[:-1], n)
    return F.linear(x, weight, bias)


def embedding_table(rows: int, dim: int) -> nn.Embedding:
    """An nn.Embedding left uninitialised (the checkpoint fills it). Its default init, normal_,
    on the meta device imports torch's symbolic-shape machinery: about 70 MB for nothing."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


def still_fused(fused: tuple | None, *linears: nn.Linear) -> bool:
    """Whether ``fused`` still backs the linears' weights (reassigning one undoes the fusion)."""
    if fused is None:
        return False
    ptr, row_bytes = fused[0].data_ptr(), fused[0].stride(0) * fused[0].element_size()
    for lin in linears:
        if lin.weight.data_ptr() != ptr:
            return False
        ptr += lin.out_features * row_bytes
    return True


class RMSNorm(nn.Module):
    """Follows transformers' ``LlamaRMSNorm``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """(T,) positions -> cos, sin of shape (T, head_dim), as transformers' default Llama RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device) / head_dim))
    freqs = pos.float()[:, None] * inv_freq  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd): rotate-half layout, not interleaved
    return emb.cos().to(dtype), emb.sin().to(dtype)


class RopeTable:
    """cos/sin rows for positions [0, length), computed once; rows are elementwise in the position,
    so a looked-up row equals ``rope_cos_sin`` of that position bit for bit."""

    def __init__(self, length: int, head_dim: int, theta: float, dtype: torch.dtype, device) -> None:
        self.cos, self.sin = rope_cos_sin(torch.arange(length, device=device), head_dim, theta, dtype)

    def fits(self, length: int, dtype: torch.dtype, device) -> bool:
        return self.cos.shape[0] >= length and self.cos.dtype == dtype and self.cos.device == torch.device(device)

    def rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[start:end], self.sin[start:end]  # (T, hd) each


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Follows transformers' ``LlamaAttention`` (GQA, RoPE, causal)."""

    fused_linears = ("q_proj", "k_proj", "v_proj")

    def __init__(self, cfg: TextConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.qkv: tuple | None = None  # (weight, bias) fused by fuse(); not part of the state dict

    def fuse(self) -> None:
        self.qkv = fuse_linears(*(getattr(self, name) for name in self.fused_linears))

    def _heads(self, x: torch.Tensor, rope: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, D) -> q (B, H, T, hd), k and v (B, Hkv, T, hd), RoPE applied to q and k."""
        b, t, _ = x.shape
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        if still_fused(self.qkv, self.q_proj, self.k_proj, self.v_proj):
            qkv = linear(x, *self.qkv).view(b, t, h + 2 * kv, hd)  # (B, T, H + 2 Hkv, hd)
            # q and k sit side by side, so one RoPE call covers both (elementwise: same bits).
            q, k = apply_rope(qkv[:, :, : h + kv].transpose(1, 2), *rope).split([h, kv], dim=1)
            return q, k, qkv[:, :, h + kv :].transpose(1, 2)
        q = self.q_proj(x).view(b, t, h, hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(b, t, kv, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(b, t, kv, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        return apply_rope(q, *rope), apply_rope(k, *rope), v

    def forward(
        self, x: torch.Tensor, rope: tuple, pos: torch.Tensor | slice, cache: KVCache | None, end: int
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self._heads(x, rope)
        if cache is not None:
            k, v = cache.update(self.layer, pos, k, v, end)  # (B, Hkv, end, hd)
        y = self._attend(q, k, v)
        y = y.transpose(1, 2).reshape(b, t, -1)  # (B, T, H*hd)
        return linear(y, self.o_proj.weight, self.o_proj.bias)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t, end = q.shape[2], k.shape[2]
        scale = self.head_dim**-0.5
        gqa = self.n_heads != self.n_kv
        if t == 1:  # one new token sees every cached position
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
        if t == end:  # a prefill from position 0: plain causal
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        # A chunk after earlier positions: query i sits at end - t + i, causal mask aligned bottom-right.
        mask = torch.ones(t, end, dtype=torch.bool, device=q.device).tril(diagonal=end - t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


class MLP(nn.Module):
    """Follows transformers' ``LlamaMLP``: down(silu(gate(x)) * up(x))."""

    fused_linears = ("gate_proj", "up_proj")

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.gate_up: tuple | None = None  # (weight, bias) fused by fuse(); not part of the state dict

    def fuse(self) -> None:
        self.gate_up = fuse_linears(*(getattr(self, name) for name in self.fused_linears))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if still_fused(self.gate_up, self.gate_proj, self.up_proj):
            gate, up = linear(x, *self.gate_up).chunk(2, dim=-1)  # (B, T, I) each
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return linear(F.silu(gate) * up, self.down_proj.weight, self.down_proj.bias)


class DecoderLayer(nn.Module):
    """Follows transformers' ``LlamaDecoderLayer``: pre-RMSNorm attention and MLP, each residual."""

    def __init__(self, cfg: TextConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, rope: tuple, pos: torch.Tensor | slice, cache: KVCache | None, end: int
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, pos, cache, end)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    """Embeddings in, logits out: (B, T, D) at positions ``pos`` (T,) -> (B, T, vocab).

    ``cache=None`` recomputes attention over the given tokens only (they must start at 0);
    with a cache, the tokens' keys/values are written at ``pos`` and attend to everything before.
    ``last_only`` projects only the final position to the vocabulary (all generation needs).
    """

    def __init__(self, cfg: TextConfig, tie_word_embeddings: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = embedding_table(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tied = tie_word_embeddings
        if tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope: RopeTable | None = None  # built on first use (the weights decide dtype and device)

    def fuse(self) -> None:
        """One matmul for q/k/v and one for gate/up in every layer (see ``fuse_linears``)."""
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

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
            x = layer(x, rope, slot, cache, end)
        if last_only:
            x = x[:, -1:]  # (B, 1, D)
        return linear(self.norm(x), self.lm_head.weight)

    def _rope_rows(self, start: int, end: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope is None or not self.rope.fits(end, x.dtype, x.device):
            length = max(end, self.cfg.max_position_embeddings)
            self.rope = RopeTable(length, self.cfg.head_dim, self.cfg.rope_theta, x.dtype, x.device)
        return self.rope.rows(start, end)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        w = self.embed_tokens.weight
        return KVCache(self.cfg, batch, max_len, w.dtype, w.device)
