"""Qwen3-VL's precision choices, from the stage-by-stage probe at the 2B shapes
(docs/precision-and-speed.md, Qwen3-VL section): which linears stay wider than the dtype and which
kernel takes each on a CPU with given flags (rules of the flags alone: ``report`` says them for
``ffai engines`` without torch), how the vision tower attends, how the KV cache is held
(``plan_precision``, the kit's ``PrecisionPlan``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ffai.kit import host
from ffai.kit import linear_kinds as kinds

if TYPE_CHECKING:  # pragma: no cover
    from ffai.kit.precision import PrecisionPlan

# The patch mergers (main and DeepStack) take 4096 concatenated values a row: one shared
# activation range loses the most there, as SmolVLM's connector did.
VISION, MERGERS, HEAD, REST = r"visual\.", r"visual\.(merger|deepstack_merger_list\.\d+)\.", r"text\.lm_head$", r"."
# Layers kept wider than the dtype: their rounding is carried through every later layer. Which
# ones was measured stage by stage at the 2B shapes (docs/precision-and-speed.md).
WIDE_VISION, WIDE_TEXT = r"visual\.blocks\.[0-3]\.", r"text\.layers\.[0-3]\."
# Without native bfloat16 only these int8 linears keep their rows unquantised (float32 rows):
# the down projections' inputs span the widest ranges from token to token.
INT8_BY_ROW_LAYERS = rf"text\.layers\.\d+\.mlp\.down_proj$|{MERGERS}"
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
    wide = kinds.BF16_ONEDNN if bf16 else kinds.FLOAT32
    tile = kinds.INT8_ONEDNN if flags & kinds.ONEDNN_INT8_FLAGS else kinds.INT8
    if bf16:
        # The vision tower whole in bfloat16: at 2B its int8 (first four blocks wide) moved the
        # features by 0.0003 only, but the prefill logits to 0.9955, under int8's 0.996 margin;
        # the text tower turns every visual token's and DeepStack feature's change into logits.
        return ((VISION, kinds.BF16_ONEDNN), (WIDE_TEXT, wide), (HEAD, kinds.INT8), (REST, kinds.INT8_BY_ROW))
    return (
        (WIDE_VISION, wide),
        (WIDE_TEXT, wide),
        (INT8_BY_ROW_LAYERS, kinds.INT8_BY_ROW),
        (VISION, tile),
        (REST, kinds.INT8),
    )


def bfloat16_linears(bf16: bool) -> tuple[tuple[str, str], ...]:
    """bfloat16's (module-name pattern, kind), the first match winning: the text tower's first
    four layers in float32, every other linear packed for oneDNN where it multiplies bfloat16
    natively (``bf16``), else a plain bfloat16 linear."""
    return ((WIDE_TEXT, kinds.FLOAT32), (REST, kinds.BF16_ONEDNN)) if bf16 else ((WIDE_TEXT, kinds.FLOAT32),)


def vision_attention_bf16(flags: frozenset[str], bf16: bool) -> bool:
    """Whether the opt-in dtypes' vision tower attends in bfloat16: a still's patches attend as one
    segment (12 288 rows at 2B's default budget) and float32 SDPA was the largest share of its
    vision tower; torch's bfloat16 flash attention is fast where oneDNN has AMX-BF16 tiles
    (SmolVLM measured it no faster on AVX512_BF16 alone)."""
    return bf16 and "amx_bf16" in flags


def _bf16_onednn(flags: frozenset[str]) -> str:
    return f"bfloat16 on oneDNN{' (AMX)' if 'amx_bf16' in flags else ''}, weight reordered once"


def _int8_kernel(pattern: str, kind: str, flags: frozenset[str], bf16: bool, earlier: tuple[str, ...]) -> kinds.Kernel:
    # The first match wins: after the wide blocks and the mergers, the vision pattern holds the rest.
    label = "other vision blocks" if pattern == VISION and WIDE_VISION in earlier else LABELS[pattern]
    bits = kinds.int8_bits(flags)
    if kind == kinds.BF16_ONEDNN and pattern == VISION:
        why = f"its int8 cost the 2B prefill logits the 0.996 margin; {ASKS_TORCH}"
        return kinds.Kernel(label, f"{_bf16_onednn(flags)}, not int8", why)
    if kind in (kinds.BF16_ONEDNN, kinds.FLOAT32):
        weights = (
            f"{_bf16_onednn(flags)}, not int8" if kind == kinds.BF16_ONEDNN else "float32, torch's default, not int8"
        )
        return kinds.Kernel(label, weights, "their rounding grows through every later layer")
    if kind == kinds.INT8_ONEDNN:
        why = (
            "AMX-INT8 tiles"
            if "amx_int8" in flags
            else "AVX-512 VNNI: exact 32-bit sums, faster than fbgemm on many rows"
        )
        return kinds.Kernel(label, f"int8 x int8 on oneDNN, {bits} activations per call", why)
    if kind == kinds.INT8:
        why = "fbgemm's int8 kernels, fastest for one row" if pattern == HEAD else "fbgemm's int8 kernels"
        if pattern == VISION:
            why = "no native bfloat16 (slower than float32 here); this recipe's 2B agreement is not measured"
        return kinds.Kernel(label, f"int8 x int8 on fbgemm, {bits} activations per call", why)
    return kinds.Kernel(label, *kinds.by_row_kernel(flags, bf16))


def _vision_attention(flags: frozenset[str], bf16: bool) -> kinds.Kernel:
    if vision_attention_bf16(flags, bf16):
        return kinds.Kernel("vision attention", "bfloat16 SDPA (AMX)", "a still's patches attend as one long segment")
    why = "AVX512_BF16 alone: bfloat16 attention no faster" if bf16 else "no AMX-BF16"
    return kinds.Kernel("vision attention", "float32 SDPA", why)


def report(flags: frozenset[str]) -> dict[str, list[dict[str, str]]]:
    """Each dtype's kernels on a CPU with ``flags``, as ``ffai engines`` prints them."""
    bf16 = host.native_bf16(flags)
    attention = _vision_attention(flags, bf16)
    rules = int8_linears(flags, bf16)
    int8 = [_int8_kernel(p, k, flags, bf16, tuple(q for q, _ in rules[:i])) for i, (p, k) in enumerate(rules)]
    bfloat16 = [
        kinds.Kernel(LABELS[p], "float32, torch's default", "the prefill logits' margin over the gate")
        if k == kinds.FLOAT32
        else kinds.Kernel("other linears", _bf16_onednn(flags), ASKS_TORCH)
        for p, k in bfloat16_linears(bf16)
    ]
    if len(bfloat16) == 1:  # no rule for the rest: each a plain linear in the plan's bfloat16
        bfloat16.append(
            kinds.Kernel("other linears", "bfloat16, torch's default", "no native bfloat16: slower than float32")
        )
    return {
        "float32": [kinds.Kernel("every linear", "float32, torch's default", "the exact path")._asdict()],
        "int8": [k._asdict() for k in (*int8, attention)],
        "bfloat16": [k._asdict() for k in (*bfloat16, attention)],
    }


def plan_precision(dtype: str, device: str = "cpu", cpu: host.CpuInfo | None = None) -> PrecisionPlan:
    """The plan for a load in ``dtype`` on ``device`` on a machine with ``cpu`` (default: this one's).

    - float32: everything as the checkpoint has it; the exact path.
    - bfloat16: every linear weight, the patch embedding and the embedding table (which the LM head
      shares) in bfloat16 but the text tower's first four layers (float32); norms and so the
      residual streams float32. Where oneDNN multiplies bfloat16 natively each bfloat16 linear is
      reordered once for it.
    - int8: the text tower's linears int8 weights with one scale per output row but its first
      four layers (bfloat16 where native, else float32), multiplying bfloat16 rows where bfloat16
      is native (else only the down projections by row, in float32; the rest int8 x int8 on
      fbgemm); the LM head int8 x int8 on fbgemm (its own copy), the embedding table bfloat16.
      The vision tower in bfloat16 where native; elsewhere int8 x int8 (fbgemm) but its first
      four blocks (float32) and its mergers (by row).
    - bfloat16 and int8 where bfloat16 is native: the KV cache bfloat16, and a decode step's
      attention over it (a still's cache is held from its prefill to its last token, a large
      share of the peak; a prefill attends as computed)."""
    import torch

    from ffai.kit.precision import EXACT_ATTENTION, Machine, VisionAttention

    machine = Machine.of(dtype, device, cpu)
    bf16 = machine.native_bf16
    if dtype == "int8":
        linears = int8_linears(machine.flags, bf16)
    elif dtype == "bfloat16":
        linears = bfloat16_linears(bf16)
    else:
        linears = ()
    low = torch.bfloat16 if machine.opt_in else None
    return machine.plan(
        linears,
        float32_parts=("visual", "text"),
        # The table in bfloat16 in both opt-in dtypes: a float32 one barely moved bfloat16's logits,
        # and int8's peak memory target (half float32's) needs its size (docs/benchmarks.md).
        embeddings=low or torch.float32,
        attention=VisionAttention(low) if low and vision_attention_bf16(machine.flags, bf16) else EXACT_ATTENTION,
        kv_cache=low if bf16 else None,
    )
