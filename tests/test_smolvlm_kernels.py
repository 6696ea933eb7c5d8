"""The opt-in dtypes' vision-tower fast paths on CPUs where oneDNN multiplies bfloat16 natively
(issue 24): the tanh GELU fused into a packed bfloat16 or oneDNN int8 fc1, and packed layers taking and giving
bfloat16 where the tower attends in bfloat16. The shortcuts must give the values of the long
way (exactly, where no rounding changes) and the GELU the value of float32 sums."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cpu_samples import AVX2_ONLY, EPYC_ZEN4, SAPPHIRE_RAPIDS
from ffai.engines.smolvlm import precision
from ffai.engines.smolvlm.config import VisionConfig
from ffai.engines.smolvlm.vision import VisionAttention, VisionMLP
from ffai.kit import host, linear_kinds
from ffai.kit.opt_in_linears import OneDnnInt8Linear, PackedBf16Linear, onednn_bf16
from ffai.kit.precision import VisionAttention as Attention

native_bf16 = pytest.mark.skipif(not onednn_bf16(), reason="oneDNN has no native bfloat16 on this CPU")

CFG = VisionConfig(
    hidden_size=64,
    intermediate_size=256,
    num_layers=1,
    num_heads=4,
    patch_size=4,
    image_size=32,
    num_channels=3,
    layer_norm_eps=1e-6,
    hidden_act="gelu_pytorch_tanh",
)


def packed(layer: torch.nn.Linear) -> PackedBf16Linear:
    return PackedBf16Linear(layer.weight, layer.bias)


@native_bf16
def test_a_packed_layer_gives_the_same_values_for_bfloat16_rows():
    torch.manual_seed(0)
    layer = packed(torch.nn.Linear(64, 96))
    x = torch.randn(2, 50, 64)
    y = layer(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert torch.equal(y.float(), layer(x))  # the float32 round trip changed nothing


@native_bf16
def test_the_fused_gelu_is_gelu_of_the_float32_sums():
    """oneDNN's post-op takes the float32 sums before they round to bfloat16: closer to the
    exact GELU than a GELU of the rounded product."""
    torch.manual_seed(1)
    dense = torch.nn.Linear(64, 256)
    layer = packed(dense)
    x = torch.randn(1, 300, 64)
    fused = layer.gelu_tanh(x)
    assert fused.dtype == torch.bfloat16 and fused.shape == (1, 300, 256)
    w, b = layer.dense_weight().double(), layer.bias.double()
    sums = F.linear(x.to(torch.bfloat16).double(), w, b)
    exact = F.gelu(sums, approximate="tanh")
    err = (fused.double() - exact).abs()
    assert float(err.max()) <= float(exact.abs().max()) * 2**-8  # one bfloat16 rounding of the result
    rounded_first = F.gelu(layer(x).double(), approximate="tanh").to(torch.bfloat16).double()
    assert float(err.mean()) < float((rounded_first - exact).abs().mean())


@pytest.mark.skipif(not host.cpu_info().flags & linear_kinds.ONEDNN_INT8_FLAGS, reason="needs AVX-512 VNNI or AMX-INT8")
def test_the_vision_mlp_fuses_the_gelu_of_a_onednn_int8_fc1():
    torch.manual_seed(2)
    mlp = VisionMLP(CFG)
    x = torch.randn(1, 40, 64)
    long_way = mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh"))
    mlp.fc1, mlp.fc2 = (OneDnnInt8Linear(layer.weight, layer.bias) for layer in (mlp.fc1, mlp.fc2))
    y = mlp(x)
    assert torch.equal(y, mlp.fc2(mlp.fc1.gelu_tanh(x)))
    assert F.cosine_similarity(y.flatten(), long_way.flatten(), dim=0) > 0.999


@native_bf16
def test_the_vision_mlp_fuses_the_gelu_of_a_packed_fc1():
    torch.manual_seed(2)
    mlp = VisionMLP(CFG)
    x = torch.randn(1, 40, 64)
    long_way = mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh"))
    mlp.fc1, mlp.fc2 = packed(mlp.fc1), packed(mlp.fc2)
    y = mlp(x)
    assert torch.equal(y, mlp.fc2(mlp.fc1.gelu_tanh(x)))
    assert F.cosine_similarity(y.float().flatten(), long_way.flatten(), dim=0) > 0.9999


@native_bf16
@pytest.mark.parametrize("stream", [torch.float32, torch.bfloat16])
def test_vision_attention_skips_the_float32_round_trip_exactly(stream):
    """int8's stream is float32, bfloat16's bfloat16; either way packed q/k/v and out
    projections with bfloat16 attention give the values of the round trip through float32."""
    torch.manual_seed(3)
    attention = VisionAttention(CFG, Attention(torch.bfloat16))
    attention.qkv, attention.out_proj = packed(attention.qkv), packed(attention.out_proj)
    x = torch.randn(2, 49, 64).to(stream)
    mask = torch.ones(2, 1, 1, 49, dtype=torch.bool)
    mask[1, ..., 40:] = False  # padded keys in the second tile
    y = attention(x, mask)
    for layer in (attention.qkv, attention.out_proj):
        layer.computes_in_bfloat16 = False  # the long way: float32 out, bfloat16 in again
    assert y.dtype == stream
    assert torch.equal(y, attention(x, mask))


def test_ffai_engines_names_the_fused_gelu_where_bfloat16_is_native():
    for text in (SAPPHIRE_RAPIDS, EPYC_ZEN4, AVX2_ONLY):
        flags = host.parse_cpuinfo(text).flags
        report = precision.report(flags)
        named = [g for dtype in ("int8", "bfloat16") for g in report[dtype] if precision.FUSED_GELU in g["kernel"]]
        # int8's wide layers and bfloat16's linears where bfloat16 is native; int8's vision
        # tower wherever it runs on oneDNN (int8 with VNNI or AMX-INT8).
        expected = 2 if host.native_bf16(flags) else 0
        expected += bool(flags & linear_kinds.ONEDNN_INT8_FLAGS)
        assert len(named) == expected, text
