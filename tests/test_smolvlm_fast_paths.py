"""The engine's fast paths give exactly what the plain paths give.

Loading fuses q/k/v (both towers) and gate/up (text) into one matmul each; the RoPE rows come
from a table built once; generation writes contiguous positions to the cache by slice. Each is
checked bit for bit against the unfused / per-call / indexed path on the tiny checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ffai_smolvlm.text import fuse_linears, linear, rope_cos_sin, still_fused
from ffai_smolvlm.weights import load_model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_model(tiny_checkpoint)


def unfuse(model) -> None:
    """Drop the fused tensors so every layer takes the separate-linear path."""
    for layer in model.text.layers:
        layer.self_attn.qkv = layer.mlp.gate_up = None
    for layer in model.vision.layers:
        layer.self_attn.qkv = None


def test_loading_fuses_every_layer_without_copying_weights(model):
    for layer in model.text.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert still_fused(attn.qkv, attn.q_proj, attn.k_proj, attn.v_proj)
        assert still_fused(mlp.gate_up, mlp.gate_proj, mlp.up_proj)
    for layer in model.vision.layers:
        attn = layer.self_attn
        assert still_fused(attn.qkv, attn.q_proj, attn.k_proj, attn.v_proj)
        assert attn.k_proj.bias.data_ptr() == attn.qkv[1].data_ptr() + attn.q_proj.out_features * 4
    # The checkpoint's names are unchanged and no fused tensor leaks into the state dict.
    names = set(model.state_dict())
    assert "text.layers.0.self_attn.k_proj.weight" in names and not any("qkv" in n or "gate_up" in n for n in names)


def test_fused_groups_are_read_into_one_buffer_not_through_the_file_map(model, tiny_checkpoint):
    """The loader reads each fusion group back to back into memory of its own; fusing then
    copies nothing, and no fused weight is a view of the memory-mapped checkpoint."""
    from safetensors import safe_open

    for layer in model.text.layers:
        weight = layer.mlp.gate_up[0]
        assert layer.mlp.gate_proj.weight.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
        # A buffer of exactly its own size: not the map of the whole file.
        assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
    with safe_open(str(tiny_checkpoint / "model.safetensors"), framework="pt") as f:
        for name in ("model.text_model.layers.0.self_attn.v_proj.weight", "model.vision_model.encoder.layers.1.self_attn.q_proj.bias",
                     "model.text_model.layers.1.mlp.up_proj.weight"):
            assert torch.equal(f.get_tensor(name), model.get_parameter(_module_name(name)))


def _module_name(checkpoint_name: str) -> str:
    from ffai_smolvlm.weights import module_name

    return module_name(checkpoint_name)


def test_a_fusion_group_in_a_bfloat16_load_is_cast_on_read(model, tiny_checkpoint):
    low = load_model(tiny_checkpoint, dtype=torch.bfloat16)
    a, b = low.text.layers[0].self_attn, model.text.layers[0].self_attn
    assert still_fused(a.qkv, a.q_proj, a.k_proj, a.v_proj) and a.qkv[0].dtype == torch.bfloat16
    assert torch.equal(a.qkv[0], b.qkv[0].to(torch.bfloat16))


def test_building_the_model_skips_torch_symbolic_machinery(tiny_checkpoint):
    """nn.Embedding's default init (normal_) on the meta device imports sympy and friends:
    about 70 MB of resident memory in every process that loads a model."""
    import subprocess
    import sys

    code = f"import sys; from ffai_smolvlm.weights import load_model; load_model({str(tiny_checkpoint)!r}); print('sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("shape", [(960, 576), (576, 576), (3072, 576), (576, 1536), (49280, 576), (256, 64), (768, 96), (36, 24), (24, 1536)])
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
    x = torch.randn(2, 7, 48)
    with torch.no_grad():
        want = torch.cat([lin(x) for lin in linears], dim=-1)
        fused = fuse_linears(*linears)
        got = nn.functional.linear(x, *fused)
        assert torch.equal(got, want)
        assert torch.equal(torch.cat([lin(x) for lin in linears], dim=-1), want)  # views still hold the weights
    assert still_fused(fused, *linears)
    linears[1].weight = nn.Parameter(linears[1].weight.clone())  # reassigning a weight undoes the fusion
    assert not still_fused(fused, *linears)


def _whole_batch(vision, pixels, mask):
    """The vision tower over every tile at once, as the reference runs it."""
    x = vision.embeddings(pixels, mask)
    key_mask = None if bool(mask.all()) else mask.reshape(mask.shape[0], 1, 1, -1)
    for layer in vision.layers:
        x = layer(x, key_mask)
    return vision.post_layernorm(x)


@pytest.mark.parametrize("padded", [False, True])
def test_vision_tile_by_tile_equals_the_whole_batch(model, padded):
    from ffai_smolvlm.model import patch_mask

    torch.manual_seed(3)
    size = model.cfg.vision.image_size
    pixels = torch.randn(5, 3, size, size)
    mask = torch.ones(5, size, size, dtype=torch.bool)
    if padded:
        mask[2, :, size // 2 :] = False  # one tile half padding: every tile takes the masked path
    patches = patch_mask(mask, model.cfg.vision.patch_size)
    with torch.no_grad():
        assert torch.equal(model.vision(pixels, patches), _whole_batch(model.vision, pixels, patches))


def test_fused_model_equals_unfused_model(model, tiny_checkpoint):
    plain = load_model(tiny_checkpoint)
    unfuse(plain)
    torch.manual_seed(1)
    pixels = torch.randn(2, 3, 64, 64)
    ids = torch.randint(0, 1000, (1, 19))
    with torch.no_grad():
        assert torch.equal(model.encode_images(pixels, None), plain.encode_images(pixels, None))
        x = model.text.embed_tokens(ids)
        assert torch.equal(model.text(x, torch.arange(19)), plain.text(x, torch.arange(19)))


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
