"""What ``--dtype`` means for SmolVLM: which of its linears stay wider than the dtype, which go to
which kernel on a CPU with given flags, and how its vision tower attends: the choices behind its
precision plan (``plan_precision``, the kit's ``PrecisionPlan``), measured on the CPU kinds
docs/precision-and-speed.md names (figures in docs/benchmarks.md).

The rules read the CPU's flags alone, so ``ffai engines`` prints what they choose (``report``)
without importing torch; ``plan_precision`` imports it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ffai.kit import host
from ffai.kit import linear_kinds as kinds

if TYPE_CHECKING:  # pragma: no cover
    from ffai.kit.precision import Machine, PrecisionPlan, VisionAttention

VISION = r"vision\."
# The first four layers of each tower stay wider than int8 (bfloat16 weights where bfloat16 is
# native, else float32): a weight's rounding there is carried and grown through every later
# layer, and these eight held most of the prefill logits' loss (docs/precision-and-speed.md).
WIDE_LAYERS = r"(vision|text)\.layers\.[0-3]\."
# bfloat16 keeps the text tower's first four layers in float32, for the same reason.
WIDE_TEXT_LAYERS = r"text\.layers\.[0-3]\."
HEAD = r"text\.lm_head$"
# Without native bfloat16, only these take int8 by row: the text MLP's down projection, whose
# input (silu(gate) * up) spans far wider ranges from token to token than any other layer's,
# and the connector, whose 12288 inputs lose the most to one shared range.
INT8_BY_ROW_LAYERS = r"text\.layers\.\d+\.mlp\.down_proj$|connector\.modality_projection\.proj$"
# Query rows per block where the vision tower attends by blocks (vision.blocked_attention).
ATTENTION_BLOCK = 128
# PackedBf16Linear.gelu_tanh, OneDnnInt8Linear.gelu_tanh: a vision MLP's GELU as oneDNN's post-op
# on the float32 sums.
FUSED_GELU = "vision fc1 with its GELU fused"
LABELS = {
    WIDE_LAYERS: "first 4 layers of each tower",
    VISION: "vision tower",
    HEAD: "LM head",
    INT8_BY_ROW_LAYERS: "connector, text MLP down projections",
}


def int8_linears(flags: frozenset[str], bf16: bool) -> tuple[tuple[str, str], ...]:
    """int8's (module-name pattern, kind) on a CPU with ``flags`` (``bf16``: oneDNN multiplies
    bfloat16 natively), the first match winning.

    The first four layers of each tower keep wider weights (``WIDE_LAYERS``). The rest of the
    vision tower (a tile's 1024 rows a call, its activation range that tile's) runs int8 on
    oneDNN where the CPU has AMX-INT8 or AVX-512 VNNI (``kinds.ONEDNN_INT8_FLAGS``: exact 32-bit sums,
    and faster than fbgemm there, AMX tiles faster than bfloat16's in half the weight memory),
    on fbgemm elsewhere. With native bfloat16 the connector and the text tower keep their
    activations unquantised (int8 weights times bfloat16 rows): int8 activations in the text
    tower cost the prefill logits more than everything else together, and one shared range was
    not the cause (docs/precision-and-speed.md). The LM head stays on fbgemm, the fastest for one
    row of 49k outputs and the least sensitive layer."""
    tile = kinds.INT8_ONEDNN if flags & kinds.ONEDNN_INT8_FLAGS else kinds.INT8
    wide = (WIDE_LAYERS, kinds.BF16_ONEDNN if bf16 else kinds.FLOAT32)
    if bf16:
        return (wide, (VISION, tile), (HEAD, kinds.INT8), (r".", kinds.INT8_BY_ROW))
    return (wide, (VISION, tile), (INT8_BY_ROW_LAYERS, kinds.INT8_BY_ROW), (r".", kinds.INT8))


def bfloat16_linears(bf16: bool) -> tuple[tuple[str, str], ...]:
    """bfloat16's (module-name pattern, kind), the first match winning: the text tower's first
    four layers in float32 (``WIDE_TEXT_LAYERS``), every other linear packed for oneDNN where it
    multiplies bfloat16 natively (``bf16``), else a plain bfloat16 linear."""
    return (
        ((WIDE_TEXT_LAYERS, kinds.FLOAT32), (r".", kinds.BF16_ONEDNN)) if bf16 else ((WIDE_TEXT_LAYERS, kinds.FLOAT32),)
    )


def vision_attention(machine: Machine) -> VisionAttention:
    """float32 and every device but the CPU: SDPA in the activations' own dtype (the exact path).
    The opt-in dtypes on the CPU: bfloat16 SDPA with AMX-BF16; bfloat16 by blocks with
    AVX512_BF16 alone, since torch's CPU flash attention packs its bfloat16 blocks for oneDNN's
    brgemm only where oneDNN finds AMX; float32 SDPA without native bfloat16."""
    import torch

    from ffai.kit.precision import EXACT_ATTENTION, VisionAttention

    if not machine.opt_in or not machine.on_cpu:
        return EXACT_ATTENTION
    if "amx_bf16" in machine.flags:
        return VisionAttention(torch.bfloat16)
    if "avx512_bf16" in machine.flags:
        return VisionAttention(torch.bfloat16, ATTENTION_BLOCK)
    return VisionAttention(torch.float32)


def plan_precision(dtype: str, device: str = "cpu", cpu: host.CpuInfo | None = None) -> PrecisionPlan:
    """The plan for a load in ``dtype`` (float32, bfloat16, int8) on ``device`` (auto, cpu, cuda)
    on a machine with ``cpu`` (default: this one's).

    - float32: everything as the checkpoint has it; the exact path.
    - bfloat16: every linear weight in bfloat16 but the text tower's first four layers' (float32,
      :func:`bfloat16_linears`), the text tower's other parameters (embedding table, RMSNorm
      weights) in float32, so its residual stream, norms and attention stay float32: a bfloat16
      stream rounded 30 layers' sums to 8 bits of mantissa, under the gate. Where oneDNN has
      native bfloat16, each bfloat16 linear is reordered once for its kernel.
    - int8: every linear's weight in int8 (CPU only) but the first four layers of each tower
      (bfloat16 or float32), held as :func:`int8_linears` says for this CPU; the rest float32.

    In both opt-in dtypes on the CPU the vision tower attends as the CPU runs it fastest
    (:func:`vision_attention`), the text tower's prefill attends in bfloat16 with AMX-BF16 (torch's
    bfloat16 flash attention runs on its tiles), and the embedding table stays in its file where
    the LM head has its own copy."""
    import torch

    from ffai.kit.precision import Machine

    machine = Machine.of(dtype, device, cpu)
    if dtype == "int8":
        linears = int8_linears(machine.flags, machine.native_bf16)
    elif dtype == "bfloat16":
        linears = bfloat16_linears(machine.native_bf16)
    else:
        linears = ()
    plan = machine.plan(
        linears,
        float32_parts=("text",) if dtype == "bfloat16" else (),
        attention=vision_attention(machine),
        text_prefill=torch.bfloat16 if machine.opt_in and machine.on_cpu and "amx_bf16" in machine.flags else None,
    )
    # Left in its file only where nothing reads the table whole: the head has its own copy.
    return dataclasses.replace(plan, embeddings_in_file=machine.on_cpu and plan.linear("text.lm_head") != kinds.PLAIN)


COMPILED_BF16_DECODE = kinds.Kernel(
    "decode step, with --compile",
    "one AOTInductor program, compiled once per machine and thread count; a row's linears as float32 sums "
    "of the bfloat16 weights in inductor's loops (the weights held once, plain)",
    "no Python between the ops; for video and batches",
)


def _int8_kernel(pattern: str, kind: str, flags: frozenset[str], bf16: bool) -> tuple[str, str]:
    if kind in (kinds.BF16_ONEDNN, kinds.FLOAT32):
        weights = (
            f"bfloat16 on oneDNN, not int8; {FUSED_GELU}"
            if kind == kinds.BF16_ONEDNN
            else "float32, torch's default, not int8"
        )
        return weights, "their rounding grows through every later layer: most of the logits' loss"
    bits = kinds.int8_bits(flags)
    if kind == kinds.INT8_ONEDNN:
        amx = " (AMX)" if "amx_int8" in flags else ""
        why = "AMX-INT8 tiles, faster than fbgemm on a tile" if amx else "AVX-512 VNNI, faster than fbgemm on a tile"
        return f"int8 x int8 on oneDNN{amx}, {bits} activations per call; {FUSED_GELU}", why
    if kind == kinds.INT8:
        why = "fbgemm's int8 kernels, fastest for one row" if pattern == HEAD else "fbgemm's int8 kernels"
        if pattern == VISION:  # a tile's rows, on a CPU without VNNI or AMX
            why = "oneDNN's int8 is not exact without VNNI (16-bit sums saturate)"
        return f"int8 x int8 on fbgemm, {bits} activations per call", why
    return kinds.by_row_kernel(flags, bf16)


def report(flags: frozenset[str]) -> dict[str, list[dict[str, str]]]:
    """Each dtype's kernels on a CPU with ``flags``, as ``ffai engines`` prints them."""
    bf16 = host.native_bf16(flags)
    rest = "connector, text tower" if bf16 else "other text linears"
    int8 = [kinds.Kernel(LABELS.get(p, rest), *_int8_kernel(p, k, flags, bf16)) for p, k in int8_linears(flags, bf16)]
    if bf16:  # the plans ffai.kit.compiled_decode compiles: int8 by row with bfloat16 rows
        int8.append(kinds.compiled_decode_kernel(flags))
        amx = " (AMX)" if "amx_bf16" in flags else ""
        bf = kinds.Kernel(
            "other linears", f"bfloat16 on oneDNN{amx}, weight reordered once; {FUSED_GELU}", "native bfloat16"
        )
    else:
        bf = kinds.Kernel("other linears", "bfloat16, torch's default", "no native bfloat16: slower than float32 here")
    wide = kinds.Kernel("first 4 text layers", "float32, torch's default", "the prefill logits' margin over the gate")
    bfloat16 = [wide, bf, COMPILED_BF16_DECODE] if bf16 else [wide, bf]
    return {
        "float32": [kinds.Kernel("every linear", "float32, torch's default", "the exact path")._asdict()],
        "int8": [k._asdict() for k in int8],
        "bfloat16": [k._asdict() for k in bfloat16],
    }
