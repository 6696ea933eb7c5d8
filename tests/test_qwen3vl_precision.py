"""Qwen3-VL's opt-in dtypes (ffai/engines/qwen3vl/precision.py): the plan on each CPU kind, the loader
building it, agreement with float32 on the tiny checkpoint, and the 2B-shape gates (``real``,
FFAI_QWEN3VL_2B=1)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from cpu_samples import AVX2_ONLY, EPYC_ZEN4, SAPPHIRE_RAPIDS, SSE_ONLY
from ffai.bench import cases, checkpoints
from ffai.bench.agreement import cosine
from ffai.bench.gates import COSINE_MIN
from ffai.engines.qwen3vl.engine import ENGINE
from ffai.engines.qwen3vl.precision import int8_linears, plan_precision
from ffai.engines.qwen3vl.stages import STAGES
from ffai.errors import UsageError
from ffai.kit import host
from ffai.kit import precision as kit_precision
from ffai.kit.generate import prefill
from ffai.kit.linear_kinds import BF16_ONEDNN, FLOAT32, INT8, INT8_BY_ROW, INT8_ONEDNN, PLAIN
from ffai.kit.opt_in_linears import PackedBf16Linear, QuantizedLinear, RowScaledLinear, onednn_bf16

NATIVE_BF16 = onednn_bf16()
QKV, PROJ_EARLY = "visual.blocks.7.attn.qkv", "visual.blocks.2.attn.proj"
MERGER, DEEPSTACK = "visual.merger.linear_fc1", "visual.deepstack_merger_list.1.linear_fc2"
Q, Q_EARLY, DOWN, HEAD = (
    "text.layers.9.self_attn.qkv",
    "text.layers.3.mlp.gate_up",
    "text.layers.9.mlp.down_proj",
    "text.lm_head",
)


def kinds(dtype: str, cpuinfo: str) -> dict[str, str]:
    plan = plan_precision(dtype, cpu=host.parse_cpuinfo(cpuinfo))
    return {n: plan.linear(n) for n in (QKV, PROJ_EARLY, MERGER, DEEPSTACK, Q, Q_EARLY, DOWN, HEAD)}


@pytest.mark.skipif(not NATIVE_BF16, reason="the plan asks torch too: this CPU lacks native bfloat16")
def test_int8_plan_on_amx_and_zen4():
    amx = kinds("int8", SAPPHIRE_RAPIDS)
    assert amx == {
        QKV: BF16_ONEDNN,  # the vision tower in bfloat16: its int8 cost the logits the margin
        PROJ_EARLY: BF16_ONEDNN,
        MERGER: BF16_ONEDNN,
        DEEPSTACK: BF16_ONEDNN,
        Q: INT8_BY_ROW,  # bfloat16 rows times the int8 weight
        Q_EARLY: BF16_ONEDNN,  # the first layers stay wider
        DOWN: INT8_BY_ROW,
        HEAD: INT8,  # fbgemm's one-row kernel
    }
    assert kinds("int8", EPYC_ZEN4) == amx
    plan = plan_precision("int8", cpu=host.parse_cpuinfo(EPYC_ZEN4))
    assert not plan.int8.reduce_range and plan.int8.rows_dtype == torch.bfloat16 and plan.weights == torch.float32
    # The cache bfloat16 in both opt-in dtypes where it is native; float32's stays exact.
    for dtype, cache in (("int8", torch.bfloat16), ("bfloat16", torch.bfloat16), ("float32", None)):
        assert plan_precision(dtype, cpu=host.parse_cpuinfo(EPYC_ZEN4)).kv_cache == cache


def test_int8_plan_on_avx2_only():
    plan = plan_precision("int8", cpu=host.parse_cpuinfo(AVX2_ONLY))
    assert plan.int8.reduce_range and plan.int8.rows_dtype == torch.float32  # 16-bit sums saturate; no native bf16
    assert plan.kv_cache is None and plan_precision("bfloat16", cpu=host.parse_cpuinfo(AVX2_ONLY)).kv_cache is None
    assert kinds("int8", AVX2_ONLY) == {
        QKV: INT8,
        PROJ_EARLY: FLOAT32,
        MERGER: INT8_BY_ROW,
        DEEPSTACK: INT8_BY_ROW,
        Q: INT8,
        Q_EARLY: FLOAT32,
        DOWN: INT8_BY_ROW,
        HEAD: INT8,
    }


def test_bfloat16_and_float32_plans():
    avx2 = kinds("bfloat16", AVX2_ONLY)
    assert avx2[Q_EARLY] == FLOAT32 and {avx2[n] for n in (QKV, PROJ_EARLY, Q, HEAD)} == {PLAIN}
    if NATIVE_BF16:
        amx = kinds("bfloat16", SAPPHIRE_RAPIDS)
        assert amx[Q_EARLY] == FLOAT32 and {amx[n] for n in (QKV, PROJ_EARLY, Q, HEAD)} == {BF16_ONEDNN}
    assert set(kinds("float32", SAPPHIRE_RAPIDS).values()) == {PLAIN}
    assert plan_precision("int8").embeddings == torch.bfloat16  # int8's head has its own copy


# What ``ffai engines`` says each kind of linear runs on (kernels.report), a word of each.
KIND_WORDS = {
    BF16_ONEDNN: "bfloat16 on oneDNN",
    FLOAT32: "float32, torch's default",
    INT8: "x int8 on fbgemm",
    INT8_ONEDNN: "x int8 on oneDNN",
    INT8_BY_ROW: "int8 weight x",
}


def test_ffai_engines_reports_the_plans_kernels(monkeypatch):
    """The report ``ffai engines`` prints (torch-free: the flags alone) is made from the rules the
    plan applies, group for group in the plan's order: AMX and Zen 4 (the vision tower bfloat16,
    AMX named only with AMX-BF16, the vision attention bfloat16 only there), AVX2 alone (the wide
    blocks float32, 7-bit fbgemm tiles, float32 rows); int8 for throughput wherever the CPU has an
    int8 dot product, float32 with neither."""
    monkeypatch.setattr(kit_precision, "onednn_bf16", lambda device="cpu": True)  # the plan by the flags alone
    labels = {
        SAPPHIRE_RAPIDS: ["vision tower (blocks, mergers)", "first 4 text layers", "LM head", "other text linears"],
        AVX2_ONLY: ["first 4 vision blocks", "first 4 text layers", "patch mergers, text MLP down projections"],
    }
    labels[EPYC_ZEN4] = labels[SAPPHIRE_RAPIDS]
    labels[AVX2_ONLY] += ["other vision blocks", "other text linears"]
    for text, expected in labels.items():
        flags = host.parse_cpuinfo(text).flags
        report = ENGINE.kernels(flags)
        assert host.parse_cpuinfo(text).throughput_dtype() == "int8"
        assert report["float32"] == [
            {"layers": "every linear", "kernel": "float32, torch's default", "why": "the exact path"}
        ]
        for dtype in ("int8", "bfloat16"):
            plan = plan_precision(dtype, cpu=host.parse_cpuinfo(text))
            *linears, attention = report[dtype]
            kinds = [k for _, k in plan.linears] + ([PLAIN] if dtype == "bfloat16" and len(plan.linears) == 1 else [])
            assert len(linears) == len(kinds), (text, dtype)
            for group, kind in zip(linears, kinds):
                words = "bfloat16, torch's default" if kind == PLAIN else KIND_WORDS[kind]
                assert words in group["kernel"], (text, dtype, group)
                assert ("(AMX)" in group["kernel"]) is (kind == BF16_ONEDNN and "amx_bf16" in flags)
                assert ("7-bit" in group["kernel"]) is (kind == INT8 and text == AVX2_ONLY), group
            assert attention["layers"] == "vision attention"
            assert attention["kernel"].startswith("bfloat16" if plan.attention.dtype == torch.bfloat16 else "float32")
        assert [g["layers"] for g in report["int8"]] == [*expected, "vision attention"]
        assert report["int8"][-1]["kernel"].startswith("bfloat16" if text == SAPPHIRE_RAPIDS else "float32")
    # The report reads the flags; the plan asks torch too, and on a torch without oneDNN's bfloat16
    # takes the other recipe: the report says so where it names bfloat16.
    amx = host.parse_cpuinfo(SAPPHIRE_RAPIDS).flags
    assert "torch's oneDNN" in ENGINE.kernels(amx)["int8"][0]["why"]
    monkeypatch.setattr(kit_precision, "onednn_bf16", lambda device="cpu": False)
    plan = plan_precision("int8", cpu=host.parse_cpuinfo(SAPPHIRE_RAPIDS))
    assert plan.linears == int8_linears(amx, False) and plan.attention.dtype is None
    assert plan.linear(QKV) == INT8_ONEDNN and plan.linear(PROJ_EARLY) == FLOAT32  # AMX-INT8 tiles, wide blocks
    assert host.parse_cpuinfo(SSE_ONLY).throughput_dtype() == "float32"


def test_int8_on_cuda_is_refused_in_one_line():
    with pytest.raises(UsageError, match="--dtype int8 runs on the CPU only"):
        plan_precision("int8", "cuda")
    assert plan_precision("int8", "auto").device == "cpu"


@pytest.fixture(scope="module")
def exact(qwen3vl_tiny):
    return STAGES.load_model(qwen3vl_tiny)


@pytest.fixture(scope="module")
def prepared(qwen3vl_tiny):
    from ffai.engines.qwen3vl.stages import Preprocessor

    return Preprocessor(qwen3vl_tiny)(cases.items("frame")[0].request(cases.decoding()))


def features_and_logits(model, prepared) -> list[torch.Tensor]:
    from ffai.engines.qwen3vl.preprocess import pixel_values

    with torch.inference_mode():
        values = pixel_values(prepared.pictures, prepared.processor)
        visual = model.encode(values, prepared.pictures.grid_thw, video=prepared.video)
        images, videos = (None, visual) if prepared.video else (visual, None)
        prompt = model.prompt_of(prepared.input_ids, images, videos)
        logits = prefill(model.text, prompt, model.text.new_cache(1, prompt.length))
    return [visual.embeds, *visual.deepstack, logits]


@pytest.mark.parametrize(("dtype", "cpuinfo"), [("int8", None), ("int8", AVX2_ONLY), ("bfloat16", None)])
def test_every_kind_builds_and_agrees_on_the_tiny_checkpoint(qwen3vl_tiny, exact, prepared, dtype, cpuinfo):
    """The tiny towers (4 vision blocks, 3 text layers) are shallower than the wide layers, so
    here only the first layer of each is wide: every kind of the plan is built from the file with
    no float32 copy left, and the features and prefill logits keep the gate's cosine with float32.
    AVX2's recipe (fbgemm's 7-bit tiles, float32 rows) runs here too: its kernels exist on any x86."""
    plan = plan_precision(dtype, cpu=None if cpuinfo is None else host.parse_cpuinfo(cpuinfo))
    plan = dataclasses.replace(plan, linears=tuple((p.replace("[0-3]", "0"), k) for p, k in plan.linears))
    model = STAGES.load_model(qwen3vl_tiny, plan)
    for name, module in model.named_modules():
        kind = plan.linear(name)
        if isinstance(module, torch.nn.Linear):
            assert module.weight.dtype == (torch.float32 if kind == FLOAT32 else plan.weights), name
            assert kind in (PLAIN, FLOAT32), name
        elif isinstance(module, (QuantizedLinear, RowScaledLinear, PackedBf16Linear)):
            assert kind not in (PLAIN, FLOAT32), name
    built = {type(m) for m in model.modules()}
    if dtype == "int8":
        assert {QuantizedLinear, RowScaledLinear} <= built and isinstance(model.text.lm_head, QuantizedLinear)
        assert (PackedBf16Linear in built) == (NATIVE_BF16 and cpuinfo is None)  # the wide layers
        # Left as parameters: the tables, the norms, the patch embedding, wide layers without native bf16.
        left = {n for n, _ in model.named_parameters()} - {n for n, _ in exact.named_parameters() if "norm" in n}
        assert all(
            n.startswith(("visual.blocks.0.", "text.layers.0.", "visual.patch_embed", "visual.pos_embed", "text.embed"))
            for n in left
        ), left
    assert model.text.embed_tokens.weight.dtype == plan.embeddings
    agreement = [
        cosine(a, b) for a, b in zip(features_and_logits(model, prepared), features_and_logits(exact, prepared))
    ]
    print(dtype, [round(c, 6) for c in agreement])
    assert min(agreement) >= COSINE_MIN[dtype]


# --- the 2B shapes (random weights, ~8.5 GB float32): by hand, FFAI_QWEN3VL_2B=1 -----------------

REAL_2B = os.environ.get("FFAI_QWEN3VL_2B") == "1"


@pytest.mark.real
@pytest.mark.skipif(not REAL_2B, reason="the 2B shapes take ~8.5 GB and minutes: set FFAI_QWEN3VL_2B=1")
def test_real_2b_opt_in_dtypes_hold_their_gates():
    """The bench's frame (a one-frame window, as video) and still at Qwen3-VL-2B's shapes: the
    visual tokens, DeepStack features and prefill logits of int8 and bfloat16 against float32 hold
    the gates (int8 with its 0.996 margin). One model in memory at a time; cosines printed (-s)."""
    import gc

    from ffai.engines.qwen3vl.stages import Preprocessor

    path = checkpoints.checkpoint("2b", "qwen3-vl")
    pre = Preprocessor(path)
    inputs = {c: pre(cases.items(c)[0].request(cases.decoding())) for c in ("frame", "still")}
    outputs = {}
    for dtype in ("float32", "int8", "bfloat16"):
        model = STAGES.load_model(path, STAGES.precision(dtype))
        outputs[dtype] = {c: features_and_logits(model, p) for c, p in inputs.items()}
        del model
        gc.collect()
    for dtype, target in (("int8", 0.996), ("bfloat16", COSINE_MIN["bfloat16"])):
        for case in inputs:
            agreement = [cosine(a, b) for a, b in zip(outputs[dtype][case], outputs["float32"][case])]
            print(dtype, case, "cosines (tokens, deepstack x3, logits):", [round(c, 6) for c in agreement])
            assert min(agreement) >= target, (dtype, case)
