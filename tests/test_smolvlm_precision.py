"""The opt-in precisions (issue #12): ``--dtype int8`` and ``--dtype bfloat16`` through the whole
path, the precision plan each makes on each kind of CPU, the int8 model's memory (no float32 copy
of a quantised weight), their agreement with float32 on the tiny checkpoint, and the slow-dtype
warning at the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from cpu_samples import AVX2_ONLY, EPYC_ZEN4, GRAVITON3, SAPPHIRE_RAPIDS, SSE_ONLY
from ffai import messages
from ffai.cli import run
from ffai.engines.contract import DecodingOptions, Request, RuntimeOptions
from ffai.engines.smolvlm import precision as kernels  # its rules and their words
from ffai.engines.smolvlm.engine import ENGINE
from ffai.engines.smolvlm.precision import ATTENTION_BLOCK, plan_precision
from ffai.engines.smolvlm.stages import STAGES
from ffai.engines.smolvlm.vision import blocked_attention
from ffai.errors import UsageError
from ffai.kit import host, linear_kinds
from ffai.kit import precision as kit_precision
from ffai.kit.generate import Prompt, prefill
from ffai.kit.linear_kinds import BF16_ONEDNN, FLOAT32, INT8, INT8_BY_ROW, INT8_ONEDNN, PLAIN
from ffai.kit.linears import FileEmbedding
from ffai.kit.opt_in_linears import (
    QUANTIZE_ROWS_BLOCK,
    OneDnnInt8Linear,
    PackedBf16Linear,
    QuantizedLinear,
    RowScaledLinear,
    onednn_bf16,
    quantize_rows,
)
from ffai.kit.precision import VisionAttention as Attention
from ffai.run.captioner import Captioner
from ffai.run.inline import InlineEngine
from ffai.run.options import CaptionOptions
from kit_calls import tower
from sample_media import make_clip

# Names of linear layers of each group, as a plan is asked about them.
LINEARS = (
    "text.lm_head",
    "text.layers.3.mlp.down_proj",
    "text.layers.0.mlp.gate_up",
    "text.layers.3.self_attn.o_proj",
    "text.layers.4.mlp.gate_up",
    "connector.modality_projection.proj",
    "vision.layers.0.self_attn.qkv",
    "vision.layers.4.self_attn.qkv",
    "vision.layers.11.mlp.fc2",
)
# The first four layers of each tower, which int8 keeps wider (kernels.WIDE_LAYERS).
WIDE = {"text.layers.3.mlp.down_proj", "text.layers.0.mlp.gate_up", "text.layers.3.self_attn.o_proj"}
WIDE |= {"vision.layers.0.self_attn.qkv"}


def test_the_float32_plan_is_the_exact_path():
    plan = plan_precision("float32", "cpu", host.parse_cpuinfo(SAPPHIRE_RAPIDS))
    assert (plan.dtype, plan.device, plan.weights, plan.float32_parts) == ("float32", "cpu", torch.float32, ())
    assert {plan.linear(name) for name in LINEARS} == {PLAIN}
    assert plan.attention == Attention(None, None) and plan.int8 is None
    assert not plan.embeddings_in_file and not plan.staged


@pytest.mark.parametrize("native", [True, False])
def test_the_int8_plan_by_cpu(monkeypatch, native):
    """Every linear int8 but the first four layers of each tower, held in bfloat16 where the CPU
    multiplies it natively (torch and the flags both say so), else in float32. The vision
    tower's activations int8 by tile, on oneDNN where the CPU has AMX-INT8 or AVX-512 VNNI, on
    fbgemm elsewhere;
    with native bfloat16 the connector and the text tower (LM head aside) keep their activations
    unquantised, without it only the down projections and the connector take rows by
    themselves. 8-bit activations only where the int8 dot product sums into 32 bits; the table
    left in its file."""
    monkeypatch.setattr(kit_precision, "onednn_bf16", lambda device="cpu": native)
    reduce_range = {EPYC_ZEN4: False, SAPPHIRE_RAPIDS: False, AVX2_ONLY: True, GRAVITON3: True, SSE_ONLY: True}
    for text, reduced in reduce_range.items():
        cpu = host.parse_cpuinfo(text)
        bf16 = native and host.native_bf16(cpu.flags)
        plan = plan_precision("int8", "auto", cpu)
        assert plan.device == "cpu" and plan.weights == torch.float32 and plan.float32_parts == ()
        kinds = {name: plan.linear(name) for name in LINEARS}
        # AVX-512 VNNI and AMX-INT8: oneDNN's int8 sums are exact
        vision = INT8_ONEDNN if text in (SAPPHIRE_RAPIDS, EPYC_ZEN4) else INT8
        by_row = {"text.layers.3.mlp.down_proj", "connector.modality_projection.proj"}
        if bf16:
            by_row |= {"text.layers.4.mlp.gate_up"}
        wide = BF16_ONEDNN if bf16 else FLOAT32
        expected = {
            name: wide
            if name in WIDE
            else vision
            if name.startswith("vision.")
            else INT8_BY_ROW
            if name in by_row
            else INT8
            for name in LINEARS
        }
        assert kinds == expected, text
        assert plan.int8.reduce_range is reduced, text
        assert plan.int8.rows_dtype == (torch.bfloat16 if bf16 else torch.float32)
        assert plan.embeddings_in_file and plan.staged


def test_ffai_engines_reports_the_plans_kernels():
    """The report ``ffai engines`` prints is made from the rules the plan applies: oneDNN only
    named where the plan packs for it, 7-bit activations where the plan reduces the range, the
    one-row kernel of the by-row layers as the layer picks it; for throughput int8 wherever the
    CPU has an int8 dot product, float32 with neither."""
    for text in (SAPPHIRE_RAPIDS, EPYC_ZEN4, AVX2_ONLY, GRAVITON3, SSE_ONLY):
        flags = host.parse_cpuinfo(text).flags
        report = ENGINE.kernels(flags)
        int8 = report["int8"]
        native = host.native_bf16(flags)
        assert [g["layers"] for g in int8][:2] == ["first 4 layers of each tower", "vision tower"]
        assert ("bfloat16" in int8[0]["kernel"]) is native and "int8" not in int8[0]["kernel"].split(",")[0]
        assert ("oneDNN" in int8[1]["kernel"]) is bool(flags & linear_kinds.ONEDNN_INT8_FLAGS), text
        assert ("(AMX)" in int8[1]["kernel"]) is ("amx_int8" in flags), text
        # --compile's step exists where the plan multiplies bfloat16 rows (compiled_decode.unsupported)
        assert (int8[-1]["layers"] == "decode step, with --compile") is native, text
        if native:  # its rows by fbgemm at ffai's two threads on AMX, by inductor's sums elsewhere
            assert ("fbgemm's int8 kernel" in int8[-1]["kernel"].split("(")[0]) is ("amx_int8" in flags), text
        assert all(
            ("7-bit" in g["kernel"]) is not bool(flags & linear_kinds.INT8_FULL_RANGE_FLAGS)
            for g in int8
            if "x int8" in g["kernel"]
        )
        by_row = next(g["kernel"] for g in int8 if "rows" in g["kernel"])
        assert ("_weight_int8pack_mm" in by_row) is native and ("_int_mm" in by_row) is (
            not native and bool(flags & linear_kinds.INT8_FULL_RANGE_FLAGS)
        ), text
        bf16 = report["bfloat16"]
        compiled = ["decode step, with --compile"] if native else []
        assert [g["layers"] for g in bf16] == ["first 4 text layers", "other linears", *compiled]
        assert bf16[0]["kernel"].startswith("float32") and ("AMX" in bf16[1]["kernel"]) is ("amx_bf16" in flags)
    assert host.parse_cpuinfo(SAPPHIRE_RAPIDS).throughput_dtype() == "int8"
    assert host.parse_cpuinfo(EPYC_ZEN4).throughput_dtype() == "int8"
    assert host.parse_cpuinfo(AVX2_ONLY).throughput_dtype() == "int8"
    assert host.parse_cpuinfo(SSE_ONLY).throughput_dtype() == "float32"


@pytest.mark.parametrize("native", [True, False])
def test_the_bfloat16_plan_with_and_without_onednns_bfloat16(monkeypatch, native):
    monkeypatch.setattr(kit_precision, "onednn_bf16", lambda device="cpu": native)
    plan = plan_precision("bfloat16", "cpu", host.parse_cpuinfo(EPYC_ZEN4))
    assert plan.weights == torch.bfloat16 and plan.float32_parts == ("text",) and plan.int8 is None
    # the text tower's first four layers in float32, the rest bfloat16 (packed where native)
    wide = {name for name in WIDE if name.startswith("text.")}
    assert {name: plan.linear(name) for name in LINEARS} == {
        name: FLOAT32 if name in wide else BF16_ONEDNN if native else PLAIN for name in LINEARS
    }
    # the head has its own bfloat16 copy only when packed: else it reads the (float32) table whole
    assert plan.embeddings_in_file is native and plan.staged


def test_the_opt_in_dtypes_attend_as_the_cpu_runs_fastest():
    """bfloat16 SDPA with AMX-BF16, bfloat16 by blocks with AVX512_BF16 alone, float32 SDPA on
    other CPUs, whatever the weights' dtype; float32 in its own dtype, the exact path."""
    expected = {SAPPHIRE_RAPIDS: Attention(torch.bfloat16), EPYC_ZEN4: Attention(torch.bfloat16, ATTENTION_BLOCK)}
    for text in (SAPPHIRE_RAPIDS, EPYC_ZEN4, AVX2_ONLY, GRAVITON3, SSE_ONLY, "processor\t: 0\n"):
        cpu = host.parse_cpuinfo(text)
        for dtype in ("int8", "bfloat16"):
            assert plan_precision(dtype, "cpu", cpu).attention == expected.get(text, Attention(torch.float32))
            # The text tower's prefill attends in bfloat16 where AMX-BF16 runs torch's flash attention.
            assert plan_precision(dtype, "cpu", cpu).text_prefill == (
                torch.bfloat16 if text == SAPPHIRE_RAPIDS else None
            )
        assert plan_precision("float32", "cpu", cpu).attention == Attention()
        assert plan_precision("float32", "cpu", cpu).text_prefill is None


def test_off_the_cpu_a_plan_is_torchs_own(monkeypatch):
    """A GPU attends in the activations' own dtype and multiplies with torch's own kernels
    (bfloat16's first four text layers in float32 there too), whatever the host CPU has; int8
    runs on the CPU only."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    plan = plan_precision("bfloat16", "auto", host.parse_cpuinfo(SAPPHIRE_RAPIDS))
    assert plan.device == "cuda" and plan.attention == Attention() and plan.text_prefill is None
    assert plan.linears == ((kernels.WIDE_TEXT_LAYERS, FLOAT32),)
    assert not plan.embeddings_in_file and plan.float32_parts == ("text",)
    assert plan_precision("int8", "auto").device == "cpu"
    with pytest.raises(UsageError, match="--dtype int8 runs on the CPU only"):
        plan_precision("int8", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plan_precision("float32", "auto").device == "cpu"
    with pytest.raises(UsageError, match="no CUDA device is available"):
        plan_precision("float32", "cuda")


@pytest.mark.parametrize("masked", [False, True])
def test_blocked_attention_is_softmax_attention(masked):
    """In float32 the blocks give SDPA's values to float32's rounding, masked or not, with a last
    block shorter than the others; in bfloat16 they stay as close to float32 as bfloat16 SDPA."""
    torch.manual_seed(0)
    n, h, t, hd = 2, 3, 100, 16
    q, k, v = (torch.randn(n, h, t, hd) * 2 for _ in range(3))
    mask = None
    if masked:
        mask = torch.ones(n, 1, 1, t, dtype=torch.bool)
        mask[1, ..., 70:] = False  # the second sequence's last 30 keys are padding
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=hd**-0.5).transpose(1, 2).reshape(n, t, -1)
    blocked = blocked_attention(q, k, v, mask, hd**-0.5, 32)
    assert blocked.shape == (n, t, h * hd)
    torch.testing.assert_close(blocked, exact, rtol=1e-5, atol=1e-5)
    low = [x.to(torch.bfloat16) for x in (q, k, v)]
    sdpa16 = F.scaled_dot_product_attention(*low, attn_mask=mask, scale=hd**-0.5).transpose(1, 2).reshape(n, t, -1)
    blocked16 = blocked_attention(*low, mask, hd**-0.5, 32)
    assert blocked16.dtype == torch.bfloat16
    assert _cosine(blocked16, exact) >= min(0.9999, _cosine(sdpa16, exact) - 1e-5)
    if masked:  # a padded key changes nothing: the same output as without those keys at all
        alone = blocked_attention(q[1:, :, :70], k[1:, :, :70], v[1:, :, :70], None, hd**-0.5, 32)
        torch.testing.assert_close(blocked[1, :70], alone[0], rtol=1e-5, atol=1e-5)


def test_runtime_options_accept_int8():
    assert RuntimeOptions(dtype="int8").dtype == "int8"
    with pytest.raises(UsageError, match="float32, bfloat16, int8"):
        RuntimeOptions(dtype="int4")


def test_int8_refuses_cuda(tiny_checkpoint):
    with pytest.raises(UsageError, match="--dtype int8 runs on the CPU only"):
        InlineEngine(ENGINE, tiny_checkpoint, RuntimeOptions(dtype="int8", device="cuda"))


@pytest.fixture(scope="module")
def int8_plan():
    return plan_precision("int8")


@pytest.fixture(scope="module")
def int8_model(tiny_checkpoint, int8_plan):
    return STAGES.load_model(tiny_checkpoint, int8_plan)


def test_int8_model_holds_no_float32_copy_of_a_quantised_weight(tiny_checkpoint, int8_plan, int8_model):
    exact = STAGES.load_model(tiny_checkpoint)
    linears = [name for name, m in exact.named_modules() if isinstance(m, torch.nn.Linear)]
    # Every linear layer of both towers, the connector and the LM head.
    assert "text.lm_head" in linears and "connector.modality_projection.proj" in linears
    assert any(n.endswith("self_attn.qkv") for n in linears) and any(n.endswith("mlp.fc1") for n in linears)
    kinds = {name: int8_plan.linear(name) for name in linears}  # which ones: test_the_int8_plan_by_cpu
    assert {INT8_BY_ROW, INT8} & set(kinds.values())  # the tiny towers' two layers are all wide: still some int8
    for name in linears:
        layer = int8_model.get_submodule(name)
        reference = exact.get_submodule(name)
        if kinds[name] == BF16_ONEDNN:  # a wide layer where bfloat16 is native: its weight in bfloat16 only
            assert isinstance(layer, PackedBf16Linear) and not list(layer.parameters()), name
            assert torch.equal(layer.dense_weight(), reference.weight.bfloat16()), name
            continue
        if kinds[name] == FLOAT32:  # a wide layer elsewhere: float32, as loaded
            assert torch.equal(layer.weight, reference.weight), name
            continue
        assert isinstance(layer, RowScaledLinear if kinds[name] == INT8_BY_ROW else QuantizedLinear), name
        assert not list(layer.parameters()) and not list(layer.buffers()), name
        int8, step, bias = _int8_weight(layer)
        assert int8.dtype == torch.int8 and int8.shape == reference.weight.shape
        assert layer.parts == getattr(reference, "parts", ())
        if reference.bias is not None:
            assert torch.equal(bias, reference.bias)
        # the int8 weight is the float weight to within half a step of its row's scale
        assert ((int8 * step[:, None] - reference.weight).abs() <= step[:, None] / 2 + 1e-7).all(), name
    converted = [name for name in linears if kinds[name] != FLOAT32]
    quantised = {f"{name}.weight" for name in converted}
    held = dict(int8_model.named_parameters())
    assert not quantised & set(held)
    assert all(p.dtype == torch.float32 for p in held.values())
    # what stays float32: norms, the patch convolution and position table, wide layers without
    # native bfloat16; the token embeddings stay in the file (FileEmbedding), read a prompt's rows at a time
    assert isinstance(int8_model.text.embed_tokens, FileEmbedding)
    table = {"text.embed_tokens.weight"}
    assert set(held) == {n for n, _ in exact.named_parameters()} - quantised - {f"{n}.bias" for n in converted} - table
    # and the float32 the int8 model holds is exactly those: the exact model's less every converted layer
    linear_numel = sum(p.numel() for n in converted for p in exact.get_submodule(n).parameters())
    table_numel = exact.text.embed_tokens.weight.numel()
    assert (
        sum(p.numel() for p in held.values()) == sum(p.numel() for p in exact.parameters()) - linear_numel - table_numel
    )
    assert not list(int8_model.buffers())


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_opt_in_dtypes_read_token_embeddings_from_the_file(tiny_checkpoint, dtype):
    """The rows a lookup reads from the file are the loaded table's, ids repeated or not, in any
    shape; an id out of range is an IndexError, as nn.Embedding's; float32 keeps its table."""
    exact = STAGES.load_model(tiny_checkpoint)
    assert isinstance(exact.text.embed_tokens, torch.nn.Embedding)
    model = STAGES.load_model(tiny_checkpoint, plan_precision(dtype))
    table = model.text.embed_tokens
    if dtype == "bfloat16" and not onednn_bf16():
        assert isinstance(table, torch.nn.Embedding)  # the head reads the whole table: it stays loaded
        return
    assert isinstance(table, FileEmbedding) and table.dtype == torch.float32
    vocab = exact.cfg.text.vocab_size
    ids = torch.tensor([[0, 5, 5, vocab - 1, 3], [3, 3, 3, 0, 1]])
    assert torch.equal(table(ids), exact.text.embed_tokens(ids))
    assert torch.equal(table(ids[0, 1:2]), exact.text.embed_tokens.weight[5:6])
    assert table(torch.empty(1, 0, dtype=torch.long)).shape == (1, 0, exact.cfg.text.hidden_size)
    with pytest.raises(IndexError):
        table(torch.tensor([vocab]))


def test_quantize_rows_equals_torch_quantize_per_channel():
    """Bit for bit, across a block boundary, over rows of very different ranges, and at exact
    halves (round half to even) and the int8 bounds."""
    gen = torch.Generator().manual_seed(6)
    rows = QUANTIZE_ROWS_BLOCK + 37
    w = torch.randn(rows, 96, generator=gen) * torch.logspace(-6, 2, rows)[:, None]
    w[0, :11] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 127.0, -127.0, 126.5, -126.5, 3e-13, 0.0])
    low, high = torch.aminmax(w, dim=1)
    scale = (torch.maximum(-low, high) / 127.0).clamp(min=1e-12).to(torch.float64)
    scale[0] = 1.0
    zero = torch.zeros(rows, dtype=torch.long)
    reference = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8).int_repr()
    assert torch.equal(quantize_rows(w, scale), reference)


def _int8_weight(layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """An int8 layer's (out, in) int8 weight, its per-row float32 scales and its bias."""
    if isinstance(layer, RowScaledLinear):
        return layer.int8_weight, layer.scale, layer.bias
    qweight, bias = torch.ops.quantized.linear_unpack(layer.packed)
    # one scale per output row, zero points 0: symmetric per-channel
    assert qweight.qscheme() == torch.per_channel_affine and qweight.q_per_channel_axis() == 0
    assert not qweight.q_per_channel_zero_points().any()
    return qweight.int_repr(), qweight.q_per_channel_scales().float(), bias


@pytest.mark.parametrize("rows_dtype", [torch.bfloat16, torch.float32])
def test_row_scaled_layer_gives_every_row_its_own_range(rows_dtype):
    """A prefill's rows far apart in range: each keeps its precision, which the fbgemm layer's
    one activation scale for all rows loses; one row (a decode step) goes through int8 with its
    own scale; the int8 weight is the fbgemm layer's own, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(48, 96, generator=gen) * 0.05, torch.randn(48, generator=gen)
    layer = RowScaledLinear(weight, bias, rows_dtype=rows_dtype)
    shared = QuantizedLinear(weight, bias, reduce_range=False)
    int8, step, _ = _int8_weight(shared)
    assert torch.equal(layer.int8_weight, int8) and torch.equal(layer.scale, step)
    dequantised = layer.int8_weight.float() * layer.scale[:, None]
    rows = torch.randn(1, 5, 96, generator=gen) * torch.logspace(-3, 1, 5)[None, :, None]  # far apart
    rows[..., :3] *= 30  # and a few outlier channels, as silu(gate) * up has
    exact = F.linear(rows, dequantised, bias)
    y = layer(rows)
    assert y.shape == exact.shape and y.dtype == torch.float32
    for r in range(5):
        assert _cosine(y[0, r] - bias, exact[0, r] - bias) > (0.9999 if rows_dtype == torch.bfloat16 else 0.999999)
    assert _cosine(shared(rows)[0, 0] - bias, exact[0, 0] - bias) < 0.99  # one shared scale loses the small row
    one = rows[:, -1:]  # a decode step: int8 by its own range, about as close as fbgemm's dynamic kernel
    assert _cosine(layer(one) - bias, exact[:, -1:] - bias) > 0.999
    assert not torch.equal(layer(one), exact[:, -1:])


def _image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((300, 400, 3)) * 255).astype("uint8"))


def _embeds_and_logits(model, image):
    prepared = model["preprocess"](Request((image,), DecodingOptions()))
    encoded = model["vision"](prepared)
    net = model["text"].net
    with torch.inference_mode():
        prompt = net.prompt(encoded)
        logits = prefill(net.text, prompt, net.text.reserve_cache(1, prompt.length))[0]
    return encoded.visual.float(), logits.float()


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


# Measured on the tiny checkpoint (three random 400x300 stills, 13 tiles each): int8 embeddings
# 0.99994, logits 0.9997; bfloat16 0.99998 and 0.99996. The bounds leave a margin for other CPUs'
# kernels, and are far above what a wrong scale, row order or dropped bias gives (< 0.9).
BOUNDS = {"int8": (0.9995, 0.999), "bfloat16": (0.9999, 0.9999)}


def _vision_attention(model) -> set:
    return {(layer.self_attn.attention_dtype, layer.self_attn.attention_block) for layer in model.vision.layers}


HOSTS = {"amx": SAPPHIRE_RAPIDS, "zen4": EPYC_ZEN4, "avx2": AVX2_ONLY}


@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
def test_the_vision_tower_attends_as_the_cpu_runs_fastest(tiny_checkpoint, dtype):
    """float32 attends in its own dtype (the exact path); the opt-in dtypes, whatever their
    weights' dtype, in bfloat16 SDPA with AMX-BF16, by bfloat16 blocks with AVX512_BF16 alone,
    and in float32 SDPA on other CPUs."""
    expected = {"amx": (torch.bfloat16, None), "zen4": (torch.bfloat16, ATTENTION_BLOCK), "avx2": (torch.float32, None)}
    for kind, info in HOSTS.items():
        model = STAGES.load_model(
            tiny_checkpoint, plan_precision(dtype, "cpu", host.parse_cpuinfo(info)), parts=("vision",)
        )
        assert _vision_attention(model) == ({(None, None)} if dtype == "float32" else {expected[kind]}), kind


def test_the_text_prefill_attends_in_the_plans_dtype_and_a_decode_row_in_its_own(tiny_checkpoint):
    """An AMX plan's text tower attends over a prefill's rows in bfloat16 (within bfloat16's
    rounding of float32's attention), over one decode row in float32, the same values as a plan
    without it; other CPUs' plans attend in float32 throughout."""
    amx = plan_precision("bfloat16", "cpu", host.parse_cpuinfo(SAPPHIRE_RAPIDS))
    zen4 = plan_precision("bfloat16", "cpu", host.parse_cpuinfo(EPYC_ZEN4))
    fast, plain = (STAGES.load_model(tiny_checkpoint, plan, parts=("text",)) for plan in (amx, zen4))
    assert {layer.self_attn.prefill_dtype for layer in fast.text.layers} == {torch.bfloat16}
    assert {layer.self_attn.prefill_dtype for layer in plain.text.layers} == {None}
    ids = torch.randint(0, fast.cfg.text.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    logits, caches = [], []
    with torch.inference_mode():
        for model in (fast, plain):
            caches.append(model.text.new_cache(1, 48))
            logits.append(prefill(model.text, Prompt(model.text.embed(ids)), caches[-1]).float())
        assert F.cosine_similarity(*logits, dim=-1).item() >= 0.9999 and not torch.equal(*logits)
        # One decode row over the same cache (the plain model's prefill): both attend in float32.
        row = ids[:, :1]
        steps = [tower(model.text, model.text.embed(row), 40, caches[1])[:, -1] for model in (fast, plain)]
    assert torch.equal(*steps)


@pytest.mark.parametrize("cpu", ["this", *HOSTS])
@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_agreement_with_float32_on_the_tiny_checkpoint(monkeypatch, tiny_checkpoint, dtype, cpu):
    """On this machine's CPU, and as loaded for each kind of CPU's attention (bfloat16 SDPA,
    bfloat16 blocks, float32 SDPA), all of which this machine runs, some slower."""
    exact = InlineEngine(ENGINE, tiny_checkpoint, RuntimeOptions(dtype="float32", device="cpu"))
    if cpu != "this":
        monkeypatch.setattr(host, "cpu_info", lambda: host.parse_cpuinfo(HOSTS[cpu]))
    fast = InlineEngine(ENGINE, tiny_checkpoint, RuntimeOptions(dtype=dtype, device="cpu"))
    if cpu != "this":
        assert len(_vision_attention(fast["vision"].net)) == 1
    embeds_bound, logits_bound = BOUNDS[dtype]
    for seed in range(2):
        image = _image(seed)
        e_exact, l_exact = _embeds_and_logits(exact, image)
        e_fast, l_fast = _embeds_and_logits(fast, image)
        assert e_fast.shape == e_exact.shape and l_fast.shape == l_exact.shape
        assert not torch.equal(e_fast, e_exact)  # really another precision, not float32 again
        assert _cosine(e_fast, e_exact) >= embeds_bound
        assert _cosine(l_fast, l_exact) >= logits_bound


def test_bfloat16_holds_matmul_weights_in_bfloat16_and_the_text_stream_in_float32(tiny_checkpoint):
    plan = plan_precision("bfloat16")
    model = STAGES.load_model(tiny_checkpoint, plan)
    packed = onednn_bf16()
    linears = {n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, PackedBf16Linear))}
    # the tiny text tower's two layers are among the first four, which stay float32
    float32 = {n for n in linears if plan.linear(n) == FLOAT32}
    assert float32 == {n for n in linears if n.startswith("text.layers.")} and float32
    assert {type(model.get_submodule(n)) is PackedBf16Linear for n in linears - float32} == {packed}
    assert {"text.lm_head", "text.layers.0.mlp.gate_up", "vision.layers.0.mlp.fc1"} <= linears
    for name, param in model.named_parameters():
        # the vision tower wholly in bfloat16; the text tower's matmuls only, but its first four layers'
        layer = name.rpartition(".")[0]
        wide = name.startswith("text.") and (layer not in linears or layer in float32)
        assert param.dtype == (torch.float32 if wide else torch.bfloat16), name
    assert "text.embed_tokens" not in linears
    assert model.text.reserve_cache(1, 10).dtype == torch.float32
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        logits = tower(model.text, model.text.embed(ids))
    assert logits.dtype == torch.float32


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("precision")
    _image(7).save(folder / "still.png")
    make_clip(folder / "clip.mp4", 4, fps=25, size=(96, 64))
    return folder / "still.png", folder / "clip.mp4"


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
@pytest.mark.parametrize("placement", ["inline", "workers"])
def test_caption_cli_runs_each_dtype_on_a_still_and_a_clip(capsys, tmp_path, tiny_checkpoint, media, dtype, placement):
    still, clip = media
    common = ["--model", str(tiny_checkpoint), "--dtype", dtype, "--max-new-tokens", "4", "--placement", placement]
    assert run(["caption", "-i", str(still), *common]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "error" not in err
    track = tmp_path / "clip.json"
    code = run(["caption", "-i", str(clip), "--fps", "2", "--window", "2", *common, "-o", str(track)])
    out, err = capsys.readouterr()
    assert code == 0, err
    cues = json.loads(track.read_text(encoding="utf-8"))["cues"]
    assert len(cues) >= 2 and all(cue["text"] for cue in cues)
    # nothing warns on this machine when the CPU runs the dtype fast
    if dtype in host.cpu_info().fast_dtypes():
        assert "warning" not in err


def test_slow_dtype_warning_reaches_the_cli(monkeypatch, capsys, tiny_checkpoint, media):
    still, _ = media
    monkeypatch.setattr(host, "cpu_info", lambda: host.parse_cpuinfo(AVX2_ONLY))
    args = ["caption", "-i", str(still), "--model", str(tiny_checkpoint), "--max-new-tokens", "2"]
    assert run([*args, "--dtype", "bfloat16", "--placement", "inline"]) == 0
    _, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("ffai: warning:")]
    assert warnings == [f"ffai: warning: {host.parse_cpuinfo(AVX2_ONLY).slow_dtype_warning('bfloat16')}"]
    assert run([*args, "--dtype", "int8", "--placement", "inline"]) == 0
    _, err = capsys.readouterr()
    assert "warning" not in err
    options = CaptionOptions(model=str(tiny_checkpoint), runtime=RuntimeOptions(dtype="bfloat16", device="cuda"))
    with messages.collect() as said:
        Captioner(options, video=False)
    assert said == []  # the warning is about the CPU


@pytest.mark.skipif(not onednn_bf16(), reason="this CPU has no native bfloat16 matmul")
def test_packed_bfloat16_linear_is_torchs_bfloat16_product():
    """Several rows: F.linear's values in bfloat16 exactly (the same oneDNN kernel); one row (a
    decode step): bfloat16 products with float32 sums, within bfloat16's rounding of the output."""
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 40), torch.randn(96)
    layer = PackedBf16Linear(weight, bias, parts=(32, 64))
    assert layer.parts == (32, 64)
    x = torch.randn(2, 5, 40)
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (2, 5, 96)
    expected = F.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16()).float()
    assert torch.equal(y, expected)
    one = layer(x[:1, :1])
    assert torch.allclose(one, expected[:1, :1], rtol=2**-7, atol=1e-2)


def _on_the_int8_grid(gen: torch.Generator, rows: int, inputs: int, outputs: int):
    """Inputs and weights that int8 quantisation represents exactly: integer inputs spanning
    -128..127 (a dynamic range whose step is 1), weights of integers up to 127 per row times the
    row's scale; and their product in float64, which an exact int8 kernel must give."""
    x = torch.randint(-128, 128, (rows, inputs), generator=gen).float()
    x[0, :2] = torch.tensor([-128.0, 127.0])
    w_int = torch.randint(-127, 128, (outputs, inputs), generator=gen).float()
    w_int[:, 0] = 127.0  # each row's largest magnitude: its scale is exactly the chosen step
    step = torch.rand(outputs, generator=gen) * 0.01 + 0.001
    exact = (x.double() @ w_int.double().t()) * step.double()
    return x, w_int * step[:, None], exact


def test_int8_linear_products_are_exact_on_fbgemm():
    """Inputs on the int8 grid: the int8 layer's output is the exact product to float32's
    rounding, whichever quantised engine torch has selected (the packed weight keeps fbgemm's
    kernel). Random inputs: within int8's rounding of the float product."""
    gen = torch.Generator().manual_seed(3)
    x, weight, exact = _on_the_int8_grid(gen, 40, 256, 96)
    layer = QuantizedLinear(weight, None, reduce_range=False)
    assert "int8 (fbgemm)" in repr(layer)
    chosen = torch.backends.quantized.engine
    for engine in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = engine
        try:
            y = layer(x)
        finally:
            torch.backends.quantized.engine = chosen
        assert ((y.double() - exact).abs() <= 1e-6 * exact.abs() + 1e-6).all(), engine
    rows = torch.randn(2, 40, 256, generator=gen)
    reference = F.linear(rows, weight)
    assert _cosine(layer(rows), reference) > 0.9998


ONEDNN_INT8 = pytest.mark.skipif(
    not host.cpu_info().flags & linear_kinds.ONEDNN_INT8_FLAGS, reason="needs a CPU with AVX-512 VNNI or AMX-INT8"
)


@ONEDNN_INT8
def test_onednn_int8_linear_is_exact_on_the_grid_and_fuses_the_gelu():
    """OneDnnInt8Linear (a tile's rows where oneDNN's int8 sums are exact): inputs on the int8
    grid give the exact product to float32's rounding; random inputs stay within int8's rounding
    of the float product; the fused GELU is the GELU of the same float32 sums; the int8 weight
    is held once, packed; no rows give no rows."""
    gen = torch.Generator().manual_seed(3)
    x, weight, exact = _on_the_int8_grid(gen, 40, 256, 96)
    layer = OneDnnInt8Linear(weight, None)
    assert "int8 (oneDNN)" in repr(layer) and not list(layer.parameters())
    y = layer(x)
    assert y.dtype == torch.float32 and ((y.double() - exact).abs() <= 1e-6 * exact.abs() + 1e-6).all()
    bias = torch.randn(96, generator=gen)
    layer = OneDnnInt8Linear(weight, bias)
    rows = torch.randn(2, 40, 256, generator=gen)
    assert _cosine(layer(rows), F.linear(rows, weight, bias)) > 0.9998
    fused = layer.gelu_tanh(rows)
    assert fused.shape == (2, 40, 96)
    assert torch.allclose(fused, F.gelu(layer(rows), approximate="tanh"), rtol=1e-5, atol=1e-5)
    assert layer(torch.empty(0, 256)).shape == (0, 96)


EXACTNESS = """
import json, torch
from ffai.kit.opt_in_linears import OneDnnInt8Linear
gen = torch.Generator().manual_seed(5)
x = torch.randint(-127, 128, (64, 512), generator=gen, dtype=torch.int8)
w = torch.randint(-127, 128, (128, 512), generator=gen, dtype=torch.int8)
w[:, 0] = 127
exact = x.long() @ w.long().t()
int_mm = torch.equal(torch._int_mm(x, w.t()).long(), exact)
xf = x.float()
xf[0, :2] = torch.tensor([-128.0, 127.0])
y = OneDnnInt8Linear(w.float(), None)(xf).double()
onednn = bool(((y - xf.double() @ w.double().t()).abs() <= 1e-6 * y.abs() + 1e-3).all())
print(json.dumps({"int_mm": int_mm, "onednn": onednn}))
"""


@ONEDNN_INT8
def test_onednns_int8_is_exact_where_the_plan_uses_it_and_not_on_avx2(tmp_path):
    """The int8 products the plan sends to oneDNN (torch._int_mm, OneDnnInt8Linear) are
    exact with oneDNN held to AVX-512 VNNI and at this CPU's best ISA (AMX where present); held to
    AVX2, 8-bit operands saturate its 16-bit sums, which is why AVX2 CPUs get neither (the plan
    and RowScaledLinear's int_mm switch, tested above)."""
    import os
    import subprocess
    import sys

    def run(isa: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
        if isa:
            env["ONEDNN_MAX_CPU_ISA"] = isa
        out = subprocess.run([sys.executable, "-c", EXACTNESS], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run(None) == {"int_mm": True, "onednn": True}
    assert run("AVX512_CORE_VNNI") == {"int_mm": True, "onednn": True}
    assert run("AVX2") != {"int_mm": True, "onednn": True}
    avx2 = plan_precision("int8", "cpu", host.parse_cpuinfo(AVX2_ONLY))
    assert avx2.int8.reduce_range and INT8_ONEDNN not in {kind for _, kind in avx2.linears}


def test_row_scaled_one_row_is_the_prefills_product_of_that_row():
    """A decode row through the one-row kernel gives what the same row gives among a prefill's
    rows, to bfloat16's rounding of the output; without native int8 sums (int_mm=False) one row
    is the float32 product with the exact int8 weight."""
    gen = torch.Generator().manual_seed(4)
    weight, bias = torch.randn(80, 192, generator=gen) * 0.05, torch.randn(80, generator=gen)
    rows = torch.randn(6, 192, generator=gen)
    bf16 = RowScaledLinear(weight, bias, rows_dtype=torch.bfloat16)
    many = bf16(rows)
    for r in range(rows.shape[0]):
        assert torch.allclose(bf16(rows[r : r + 1]), many[r : r + 1], rtol=2**-7, atol=2**-7 * many.abs().max())
    plain = RowScaledLinear(weight, bias, rows_dtype=torch.float32, int_mm=False)
    dequantised = plain.int8_weight.float() * plain.scale[:, None]
    assert torch.allclose(plain(rows[:1]), F.linear(rows[:1], dequantised, bias), rtol=1e-5, atol=1e-5)


def test_v2_opt_in_dtypes_pass_the_agreement_gate_on_a_window_as_video(monkeypatch):
    """SmolVLM2's opt-in dtypes on a window sent as a video hold the bench's agreement gate
    (``gates.COSINE_MIN``: the cosine of the prefill logits with float32): int8 and bfloat16 as
    planned for this CPU; int8 as planned for an AVX2-only one (7-bit activations, the wide
    layers in float32); and int8 with no layer kept wide, since the tiny towers' two layers are
    all among the first four: that way every layer is int8."""
    from ffai.bench import checkpoints
    from ffai.bench.agreement import cosine
    from ffai.bench.engine_hooks import prefill_logits
    from ffai.bench.gates import COSINE_MIN

    v2_tiny = checkpoints.checkpoint("v2-tiny")
    frames = tuple(_image(seed) for seed in (3, 4))
    request = Request.frames(frames, (10.0, 11.0), DecodingOptions(), span=(10.0, 12.0))
    exact = InlineEngine(ENGINE, v2_tiny, RuntimeOptions(dtype="float32", device="cpu"))
    prepared = exact["preprocess"](request)  # the same for every dtype
    assert prepared.input_ids.count(exact["text"].net.cfg.image_token_id) == 2 * 16  # two frames, not tiled
    want = prefill_logits(exact, exact["vision"](prepared))
    for dtype, cpu, wide in [
        ("int8", None, True),
        ("bfloat16", None, True),
        ("int8", AVX2_ONLY, True),
        ("int8", None, False),
    ]:
        with monkeypatch.context() as patch:
            if cpu is not None:
                patch.setattr(host, "cpu_info", lambda text=cpu: host.parse_cpuinfo(text))
            if not wide:
                patch.setattr(kernels, "WIDE_LAYERS", r"(?!)")  # matches no name
            fast = InlineEngine(ENGINE, v2_tiny, RuntimeOptions(dtype=dtype, device="cpu"))
        logits = prefill_logits(fast, fast["vision"](prepared))
        assert not torch.equal(logits, want), dtype
        assert cosine(logits, want) >= COSINE_MIN[dtype], (dtype, cpu, wide)
