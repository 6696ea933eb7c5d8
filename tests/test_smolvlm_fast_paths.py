"""The engine's fast paths give exactly what the plain paths give.

q/k/v (both towers) and gate/up (text) run as one matmul each, read from the checkpoint into one
buffer each; the RoPE rows come from a table built once and rotate by one roll; RMSNorm is
torch's rms_norm on the CPU; generation writes contiguous positions to the cache by slice. Each is checked bit for bit against the separate / per-call / indexed
path on the tiny checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ffai.engines.smolvlm.layers import FusedLinear, linear
from ffai.engines.smolvlm.precision import plan_precision
from ffai.engines.smolvlm.text import apply_rope, rope_cos_sin
from ffai.engines.smolvlm.weights import load_model, model_tensor
from ffai.kit.opt_in_linears import PackedBf16Linear

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_model(tiny_checkpoint)


def fused_linears(model) -> list[FusedLinear]:
    return [m for m in model.modules() if isinstance(m, FusedLinear)]


def test_loading_reads_each_fused_group_into_one_buffer_not_through_the_file_map(model, tiny_checkpoint):
    """Every q/k/v and gate/up is one buffer of exactly its own size (not a view of the
    memory-mapped file, not a concatenation after reading), and each of its parts holds the
    checkpoint's tensor bit for bit, as does every other parameter."""
    from safetensors import safe_open

    cfg = model.cfg
    fused = fused_linears(model)
    assert len(fused) == 2 * cfg.text.num_hidden_layers + cfg.vision.num_hidden_layers
    for lin in fused:
        for t in (lin.weight, lin.bias) if lin.bias is not None else (lin.weight,):
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    with safe_open(str(tiny_checkpoint / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            assert torch.equal(f.get_tensor(name), model_tensor(model, name)), name


def test_a_fusion_group_in_a_bfloat16_load_is_cast_on_read(model, tiny_checkpoint):
    low = load_model(tiny_checkpoint, plan_precision("bfloat16"))
    # the vision tower's: bfloat16 keeps the text tower's first four layers in float32
    qkv = low.vision.layers[0].self_attn.qkv  # packed for oneDNN where the CPU has native bfloat16
    a = qkv.dense_weight() if isinstance(qkv, PackedBf16Linear) else qkv.weight
    b = model.vision.layers[0].self_attn.qkv.weight
    assert a.dtype == torch.bfloat16 and a.untyped_storage().nbytes() == a.numel() * a.element_size()
    assert torch.equal(a, b.to(torch.bfloat16))


def test_building_the_model_skips_torch_symbolic_machinery(tiny_checkpoint):
    """nn.Embedding's default init (normal_) on the meta device imports sympy and friends:
    about 70 MB of resident memory in every process that loads a model."""
    import subprocess
    import sys

    code = f"import sys; from ffai.engines.smolvlm.weights import load_model; load_model({str(tiny_checkpoint)!r}); print('sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize(
    "shape",
    [(960, 576), (576, 576), (3072, 576), (576, 1536), (49280, 576), (256, 64), (768, 96), (36, 24), (24, 1536)],
)
def test_a_one_row_linear_over_threads_equals_f_linear_bit_for_bit(shape, threads):
    """The decode step's matrix-vector products, with SmolVLM-256M's shapes (and the tiny
    config's), split over threads: every output identical to F.linear's."""
    torch.manual_seed(shape[0] + threads)
    weight = torch.randn(shape)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for x in (torch.randn(1, 1, shape[1]), torch.randn(1, shape[1]), torch.randn(1, 5, shape[1])[:, -1:]):
            assert torch.equal(linear(x, weight), F.linear(x, weight))
        wide = torch.randn(2, 3, shape[1])  # more than one row: F.linear itself
        assert torch.equal(linear(wide, weight), F.linear(wide, weight))
    finally:
        torch.set_num_threads(before)


def test_fused_linears_equal_separate_ones_bit_for_bit():
    torch.manual_seed(0)
    linears = [nn.Linear(48, 40), nn.Linear(48, 16), nn.Linear(48, 16)]
    fused = FusedLinear(48, (40, 16, 16), bias=True)
    with torch.no_grad():
        for lin, rows in zip(linears, fused.part_rows()):
            fused.weight[rows] = lin.weight
            fused.bias[rows] = lin.bias
        for x in (torch.randn(2, 7, 48), torch.randn(1, 1, 48)):
            assert torch.equal(fused(x), torch.cat([lin(x) for lin in linears], dim=-1))


def separate(lin: FusedLinear, x: torch.Tensor) -> list[torch.Tensor]:
    """What the reference computes: one linear per part, each weight a tensor of its own."""
    bias = [None] * len(lin.parts) if lin.bias is None else [lin.bias[r].clone() for r in lin.part_rows()]
    return [F.linear(x, lin.weight[r].clone(), b) for r, b in zip(lin.part_rows(), bias)]


def test_the_model_fused_projections_equal_separate_ones(model):
    """Each layer's attention and MLP as the reference runs them (separate q, k, v, gate and up
    projections, RoPE on q and k apart), against the model's fused forward: same bits."""
    torch.manual_seed(1)
    text, t = model.text, 19
    with torch.no_grad():
        for layer in text.layers:
            attn, mlp = layer.self_attn, layer.mlp
            x = torch.randn(1, t, text.cfg.hidden_size)
            rope = text._rope_rows(0, t, x)
            q, k, v = (y.view(1, t, -1, attn.head_dim).transpose(1, 2) for y in separate(attn.qkv, x))
            y = attn._attend(apply_rope(q, *rope), apply_rope(k, *rope), v).transpose(1, 2).reshape(1, t, -1)
            assert torch.equal(attn(x, rope, slice(0, t), None, t), attn.o_proj(y))
            gate, up = separate(mlp.gate_up, x)
            assert torch.equal(mlp(x), mlp.down_proj(F.silu(gate) * up))
        for layer in model.vision.layers:
            attn = layer.self_attn
            x = torch.randn(2, 64, model.cfg.vision.hidden_size)
            q, k, v = (y.view(2, 64, attn.n_heads, attn.head_dim).transpose(1, 2) for y in separate(attn.qkv, x))
            y = F.scaled_dot_product_attention(q, k, v, scale=attn.head_dim**-0.5).transpose(1, 2).reshape(2, 64, -1)
            assert torch.equal(attn(x, None), attn.out_proj(y))


def _whole_batch(vision, pixels, mask):
    """The vision tower over every tile at once, as the reference runs it."""
    x = vision.embeddings(pixels, mask)
    key_mask = None if bool(mask.all()) else mask.reshape(mask.shape[0], 1, 1, -1)
    for layer in vision.layers:
        x = layer(x, key_mask)
    return vision.post_layernorm(x)


@pytest.mark.parametrize("padded", [False, True])
def test_vision_tile_by_tile_equals_the_whole_batch(model, padded):
    from ffai.engines.smolvlm.model import patch_mask

    torch.manual_seed(3)
    size = model.cfg.vision.image_size
    pixels = torch.randn(5, 3, size, size)
    mask = torch.ones(5, size, size, dtype=torch.bool)
    if padded:
        mask[2, :, size // 2 :] = False  # one tile half padding: every tile takes the masked path
    patches = patch_mask(mask, model.cfg.vision.patch_size)
    with torch.no_grad():
        assert torch.equal(model.vision(pixels, patches), _whole_batch(model.vision, pixels, patches))


def test_rope_table_rows_equal_per_call_rope(model):
    cfg = model.text.cfg
    with torch.no_grad():
        model.text(model.text.embed_tokens(torch.tensor([[5, 6, 7]])), torch.arange(3))
    table = model.text.rope
    assert table.cos.shape[0] >= cfg.max_position_embeddings
    for start, end in [(0, 1), (0, 37), (250, 251), (cfg.max_position_embeddings - 3, cfg.max_position_embeddings)]:
        cos, sin = rope_cos_sin(torch.arange(start, end), cfg.head_dim, cfg.rope_theta, torch.float32)
        got_cos, got_sin = table.rows(start, end)
        assert torch.equal(got_cos, cos) and torch.equal(got_sin, sin)


def _reference_rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm, step by step."""
    dtype = x.dtype
    y = x.to(torch.float32)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * y.to(dtype)


def test_rms_norm_equals_the_reference_steps_bit_for_bit(model):
    torch.manual_seed(4)
    norm = model.text.layers[0].input_layernorm
    with torch.no_grad():
        for i, rows in enumerate((1, 2, 37, 300)):
            norm.weight.copy_(torch.randn_like(norm.weight) * (i + 0.5))
            for scale in (1e-4, 1.0, 1e3):
                x = torch.randn(1, rows, norm.weight.shape[0]) * scale
                assert torch.equal(norm(x), _reference_rms_norm(norm, x)), (rows, scale)


def test_rope_as_one_roll_equals_rotate_half_bit_for_bit(model):
    """The reference's x * cos + rotate_half(x) * sin, with its unsigned sin, against apply_rope
    with the signed sin of rope_cos_sin."""
    cfg = model.text.cfg
    hd = cfg.head_dim
    pos = torch.tensor([0, 1, 7, 300, cfg.max_position_embeddings - 1])
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    emb = torch.cat((pos.float()[:, None] * inv_freq,) * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    torch.manual_seed(5)
    x = torch.randn(1, 3, pos.shape[0], hd) * 10
    x1, x2 = x.chunk(2, dim=-1)
    reference = x * cos + torch.cat((-x2, x1), dim=-1) * sin
    ours_cos, ours_sin = rope_cos_sin(pos, hd, cfg.rope_theta, torch.float32)
    assert torch.equal(ours_cos, cos)
    assert torch.equal(apply_rope(x, ours_cos, ours_sin), reference)


def test_scattered_positions_take_the_indexed_path(model):
    """Non-contiguous positions (generation never makes them) are written by index, not by slice."""
    torch.manual_seed(2)
    x = torch.randn(1, 4, model.text.cfg.hidden_size)
    with torch.no_grad():
        cache = model.text.new_cache(1, 16)
        model.text(x[:, :2], torch.arange(2), cache)
        model.text(x[:, 2:4], torch.tensor([2, 5]), cache)  # a gap at 3 and 4
    k = cache.k[0][0, 0]  # (max_len, hd)
    assert k[3:5].eq(0).all() and k[:3].ne(0).any(dim=1).all() and k[5].ne(0).any()
