"""Which of torch's kernels run Qwen3-VL's linears (and its vision attention) in each dtype on a
given CPU: rules of the CPU's flags alone, so ``ffai engines`` can print them without importing torch.

The precision plan (``precision.plan_precision``) takes its linears from :func:`int8_linears` and
:func:`bfloat16_linears` and its vision attention from :func:`vision_attention_bf16`, and builds
the layers (``ffai.kit.opt_in_linears``); :func:`report` says in words what the same rules choose.
The stage-by-stage probe behind each rule: docs/precision-and-speed.md (Qwen3-VL section).
"""

from __future__ import annotations

from typing import NamedTuple

# How a linear layer is held (PrecisionPlan.linear), and the flags that choose: the core's, for every engine.
from ffai.kit.linear_kinds import BF16_ONEDNN as BF16_ONEDNN
from ffai.kit.linear_kinds import FLOAT32 as FLOAT32
from ffai.kit.linear_kinds import INT8 as INT8
from ffai.kit.linear_kinds import INT8_BY_ROW as INT8_BY_ROW
from ffai.kit.linear_kinds import INT8_FULL_RANGE_FLAGS as INT8_FULL_RANGE_FLAGS
from ffai.kit.linear_kinds import INT8_ONEDNN as INT8_ONEDNN
from ffai.kit.linear_kinds import ONEDNN_INT8_FLAGS as ONEDNN_INT8_FLAGS
from ffai.kit.linear_kinds import PLAIN as PLAIN
from ffai.kit.linear_kinds import by_row_kernel
from ffai.kit.linear_kinds import native_bf16_flags as native_bf16_flags

VISION = r"visual\."
# The patch mergers (main and DeepStack) take 4096 concatenated values a row: one shared
# activation range loses the most there, as SmolVLM's connector did.
MERGERS = r"visual\.(merger|deepstack_merger_list\.\d+)\."
HEAD = r"text\.lm_head$"
# Layers kept wider than the dtype: their rounding is carried through every later layer. Which
# ones was measured stage by stage at the 2B shapes (docs/precision-and-speed.md).
WIDE_VISION = r"visual\.blocks\.[0-3]\."
WIDE_TEXT = r"text\.layers\.[0-3]\."
# Without native bfloat16 only these int8 linears keep their rows unquantised (float32 rows):
# the down projections' inputs span the widest ranges from token to token.
INT8_BY_ROW_LAYERS = rf"text\.layers\.\d+\.mlp\.down_proj$|{MERGERS}"
REST = r"."
LABELS = {
    WIDE_VISION: "first 4 vision blocks",
    WIDE_TEXT: "first 4 text layers",
    VISION: "vision tower (blocks, mergers)",
    INT8_BY_ROW_LAYERS: "patch mergers, text MLP down projections",
    HEAD: "LM head",
    REST: "other text linears",
}
# The report names its choices by the flags alone; the plan also asks torch (onednn_bf16), and a
# torch whose oneDNN lacks bfloat16 on a CPU that has it makes the plan take the other recipe.
ASKS_TORCH = "native bfloat16 by the flags; where torch's oneDNN lacks it, the plan runs the no-bfloat16 recipe"


def int8_linears(flags: frozenset[str], bf16: bool) -> tuple[tuple[str, str], ...]:
    """int8's (module-name pattern, kind) on a CPU with ``flags`` (``bf16``: oneDNN multiplies
    bfloat16 natively), the first match winning."""
    wide = BF16_ONEDNN if bf16 else FLOAT32
    tile = INT8_ONEDNN if flags & ONEDNN_INT8_FLAGS else INT8
    if bf16:
        # The vision tower whole in bfloat16: at 2B its int8 (first four blocks wide) moved the
        # features by 0.0003 only, but the prefill logits to 0.9955, under int8's 0.996 margin;
        # the text tower turns every visual token's and DeepStack feature's change into logits.
        return ((VISION, BF16_ONEDNN), (WIDE_TEXT, wide), (HEAD, INT8), (REST, INT8_BY_ROW))
    return ((WIDE_VISION, wide), (WIDE_TEXT, wide), (INT8_BY_ROW_LAYERS, INT8_BY_ROW), (VISION, tile), (REST, INT8))


def bfloat16_linears(bf16: bool) -> tuple[tuple[str, str], ...]:
    """bfloat16's (module-name pattern, kind), the first match winning: the text tower's first
    four layers in float32, every other linear packed for oneDNN where it multiplies bfloat16
    natively (``bf16``), else a plain bfloat16 linear."""
    return ((WIDE_TEXT, FLOAT32), (REST, BF16_ONEDNN)) if bf16 else ((WIDE_TEXT, FLOAT32),)


def vision_attention_bf16(flags: frozenset[str], bf16: bool) -> bool:
    """Whether the opt-in dtypes' vision tower attends in bfloat16: a still's patches attend as one
    segment (12 288 rows at 2B's default budget) and float32 SDPA was the largest share of its
    vision tower; torch's bfloat16 flash attention is fast where oneDNN has AMX-BF16 tiles
    (SmolVLM measured it no faster on AVX512_BF16 alone)."""
    return bf16 and "amx_bf16" in flags


class Kernel(NamedTuple):
    """One group of layers: what runs them, and why."""

    layers: str
    kernel: str
    why: str


def _bf16_onednn(flags: frozenset[str]) -> str:
    return f"bfloat16 on oneDNN{' (AMX)' if 'amx_bf16' in flags else ''}, weight reordered once"


def _int8_kernel(pattern: str, kind: str, flags: frozenset[str], bf16: bool, earlier: tuple[str, ...]) -> Kernel:
    # The first match wins: after the wide blocks and the mergers, the vision pattern holds the rest.
    label = "other vision blocks" if pattern == VISION and WIDE_VISION in earlier else LABELS[pattern]
    bits = "8-bit" if flags & INT8_FULL_RANGE_FLAGS else "7-bit (16-bit sums saturate)"
    if kind == BF16_ONEDNN and pattern == VISION:
        why = f"its int8 cost the 2B prefill logits the 0.996 margin; {ASKS_TORCH}"
        return Kernel(label, f"{_bf16_onednn(flags)}, not int8", why)
    if kind in (BF16_ONEDNN, FLOAT32):
        weights = f"{_bf16_onednn(flags)}, not int8" if kind == BF16_ONEDNN else "float32, torch's default, not int8"
        return Kernel(label, weights, "their rounding grows through every later layer")
    if kind == INT8_ONEDNN:
        why = (
            "AMX-INT8 tiles"
            if "amx_int8" in flags
            else "AVX-512 VNNI: exact 32-bit sums, faster than fbgemm on many rows"
        )
        return Kernel(label, f"int8 x int8 on oneDNN, {bits} activations per call", why)
    if kind == INT8:
        why = "fbgemm's int8 kernels, fastest for one row" if pattern == HEAD else "fbgemm's int8 kernels"
        if pattern == VISION:
            why = "no native bfloat16 (slower than float32 here); this recipe's 2B agreement is not measured"
        return Kernel(label, f"int8 x int8 on fbgemm, {bits} activations per call", why)
    return Kernel(label, *by_row_kernel(flags, bf16))


def _vision_attention(flags: frozenset[str], bf16: bool) -> Kernel:
    if vision_attention_bf16(flags, bf16):
        return Kernel("vision attention", "bfloat16 SDPA (AMX)", "a still's patches attend as one long segment")
    why = "AVX512_BF16 alone: bfloat16 attention no faster" if bf16 else "no AMX-BF16"
    return Kernel("vision attention", "float32 SDPA", why)


def throughput_dtype(flags: frozenset[str]) -> str:
    """The opt-in dtype for throughput on a CPU with ``flags``: int8 wherever the CPU has an int8
    dot product, bfloat16 with native bfloat16 alone, else float32. Measured for Qwen3-VL on AMX
    (docs/benchmarks.md); on the other kinds it follows SmolVLM's measurements of the same kernels."""
    if flags & {"avx2", "avx512_vnni", "avx_vnni", "amx_int8"}:
        return "int8"
    return "bfloat16" if native_bf16_flags(flags) else "float32"


def report(flags: frozenset[str]) -> dict[str, list[dict[str, str]]]:
    """Each dtype's kernels on a CPU with ``flags``, as ``ffai engines`` prints them."""
    bf16 = native_bf16_flags(flags)
    attention = _vision_attention(flags, bf16)
    rules = int8_linears(flags, bf16)
    int8 = [_int8_kernel(p, k, flags, bf16, tuple(q for q, _ in rules[:i])) for i, (p, k) in enumerate(rules)]
    bfloat16 = [
        Kernel(LABELS[p], "float32, torch's default", "the prefill logits' margin over the gate")
        if k == FLOAT32
        else Kernel("other linears", _bf16_onednn(flags), ASKS_TORCH)
        for p, k in bfloat16_linears(bf16)
    ]
    if len(bfloat16) == 1:  # no rule for the rest: each a plain linear in the plan's bfloat16
        bfloat16.append(Kernel("other linears", "bfloat16, torch's default", "no native bfloat16: slower than float32"))
    return {
        "float32": [Kernel("every linear", "float32, torch's default", "the exact path")._asdict()],
        "int8": [k._asdict() for k in (*int8, attention)],
        "bfloat16": [k._asdict() for k in (*bfloat16, attention)],
    }
