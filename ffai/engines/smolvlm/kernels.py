"""Which of torch's kernels run SmolVLM's linears in each dtype on a given CPU: rules of the
CPU's flags alone, so ``ffai engines`` can print them without importing torch.

The precision plan (``precision.plan_precision``) takes its int8 linears from
:func:`int8_linears` and builds their layers (``ffai.kit.opt_in_linears``); :func:`report` says in words
what the same rules choose. Each rule was measured on the CPU kinds docs/precision-and-speed.md
names, with the figures in docs/benchmarks.md.
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
from ffai.kit.linear_kinds import NATIVE_BF16_FLAGS as NATIVE_BF16_FLAGS
from ffai.kit.linear_kinds import ONEDNN_INT8_FLAGS as ONEDNN_INT8_FLAGS
from ffai.kit.linear_kinds import PLAIN as PLAIN
from ffai.kit.linear_kinds import by_row_kernel
from ffai.kit.linear_kinds import native_bf16_flags as native_bf16_flags

VISION = r"vision\."
# The first four layers of each tower stay wider than int8 (bfloat16 weights where bfloat16 is
# native, else float32): a weight's rounding there is carried and grown through every later
# layer, and these eight held about two thirds of the prefill logits' loss (docs/precision-and-speed.md).
WIDE_LAYERS = r"(vision|text)\.layers\.[0-3]\."
# bfloat16 keeps the text tower's first four layers in float32, for the same reason.
WIDE_TEXT_LAYERS = r"text\.layers\.[0-3]\."
HEAD = r"text\.lm_head$"
# Without native bfloat16, only these take int8 by row: the text MLP's down projection, whose
# input (silu(gate) * up) spans far wider ranges from token to token than any other layer's,
# and the connector, whose 12288 inputs lose the most to one shared range.
INT8_BY_ROW_LAYERS = r"text\.layers\.\d+\.mlp\.down_proj$|connector\.modality_projection\.proj$"
# PackedBf16Linear.gelu_tanh, OneDnnInt8Linear.gelu_tanh: a vision MLP's GELU as oneDNN's post-op
# on the float32 sums.
FUSED_GELU = "vision fc1 with its GELU fused"
ONEDNN_VNNI_WHY = "AVX-512 VNNI: about 0.9x fbgemm's time on a tile"
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
    oneDNN where the CPU has AMX-INT8 or AVX-512 VNNI (``ONEDNN_INT8_FLAGS``: exact 32-bit sums),
    on fbgemm elsewhere. With native bfloat16 the connector and
    the text tower keep their activations unquantised (int8 weights times bfloat16 rows): int8
    activations in the text tower cost the prefill logits more than everything else together,
    and one shared range was not the cause (docs/precision-and-speed.md). The LM head stays on
    fbgemm, the fastest for one row of 49k outputs and the least sensitive layer."""
    # On AMX, OneDnnInt8Linear's tiles ran faster than bfloat16's (both with the GELU fused) in
    # half the weight memory (docs/benchmarks.md, "AMX tiles: int8 again").
    tile = INT8_ONEDNN if flags & ONEDNN_INT8_FLAGS else INT8
    wide = (WIDE_LAYERS, BF16_ONEDNN if bf16 else FLOAT32)
    if bf16:
        return (wide, (VISION, tile), (HEAD, INT8), (r".", INT8_BY_ROW))
    return (wide, (VISION, tile), (INT8_BY_ROW_LAYERS, INT8_BY_ROW), (r".", INT8))


def bfloat16_linears(bf16: bool) -> tuple[tuple[str, str], ...]:
    """bfloat16's (module-name pattern, kind), the first match winning: the text tower's first
    four layers in float32 (``WIDE_TEXT_LAYERS``), every other linear packed for oneDNN where it
    multiplies bfloat16 natively (``bf16``), else a plain bfloat16 linear."""
    return ((WIDE_TEXT_LAYERS, FLOAT32), (r".", BF16_ONEDNN)) if bf16 else ((WIDE_TEXT_LAYERS, FLOAT32),)


class Kernel(NamedTuple):
    """One group of linears: what runs them, and why."""

    layers: str
    kernel: str
    why: str


def compiled_decode_kernel(flags: frozenset[str]) -> Kernel:
    """What ``--compile`` runs int8's decode step as on a CPU with ``flags`` (at ffai's thread
    count, its cores): :func:`compiled_row_kernel`'s choice in words."""
    rows = (
        "fbgemm's int8 kernel"
        if compiled_row_kernel(2, flags) == "fbgemm"
        else "inductor's loops over the int8 weights (one thread: fbgemm's int8 kernel)"
    )
    return Kernel(
        "decode step, with --compile",
        f"one AOTInductor program, compiled once per machine and thread count; a row's text linears by {rows}",
        "no Python between the ops: the step 2-3x faster than eager, at llama.cpp Q8_0's speed; for video and batches",
    )


COMPILED_BF16_DECODE = Kernel(
    "decode step, with --compile",
    "one AOTInductor program, compiled once per machine and thread count; a row's linears as float32 sums "
    "of the bfloat16 weights in inductor's loops (the weights held once, plain)",
    "no Python between the ops: the step about 1.5x faster than eager; for video and batches",
)


def compiled_row_kernel(threads: int, flags: frozenset[str]) -> str:
    """The int8 kernel for a decode row in ``--compile``'s step at ``threads`` of torch's threads on
    a CPU with ``flags``: inductor's own float32 sums over the int8 weights (``"sums"``) at two
    threads or more on CPUs without AMX, where they keep every call inside the program (an fbgemm
    call leaves it, and the other threads wait through its serial part) and need no packed copy
    of the weights; fbgemm's int8 dot products elsewhere: at one thread, where the step is
    compute-bound, and on the AMX Xeons at any count, whose cores ran the sums' loops slower than
    fbgemm at two threads too (docs/benchmarks.md has the figures from AMD Zen 4 and the AMX Xeon)."""
    return "sums" if threads > 1 and "amx_int8" not in flags else "fbgemm"


def _int8_kernel(pattern: str, kind: str, flags: frozenset[str], bf16: bool) -> tuple[str, str]:
    if kind in (BF16_ONEDNN, FLOAT32):
        weights = (
            f"bfloat16 on oneDNN, not int8; {FUSED_GELU}"
            if kind == BF16_ONEDNN
            else "float32, torch's default, not int8"
        )
        return weights, "their rounding grows through every later layer: most of the logits' loss"
    bits = "8-bit" if flags & INT8_FULL_RANGE_FLAGS else "7-bit (16-bit sums saturate)"
    if kind == INT8_ONEDNN:
        why = "AMX-INT8 tiles: about 3x fbgemm on a tile" if "amx_int8" in flags else ONEDNN_VNNI_WHY
        amx = " (AMX)" if "amx_int8" in flags else ""
        return f"int8 x int8 on oneDNN{amx}, {bits} activations per call; {FUSED_GELU}", why
    if kind == INT8:
        why = "fbgemm's int8 kernels, fastest for one row" if pattern == HEAD else "fbgemm's int8 kernels"
        if pattern == VISION:  # a tile's rows, on a CPU without VNNI or AMX
            why = "oneDNN's int8 is not exact without VNNI (16-bit sums saturate)"
        return f"int8 x int8 on fbgemm, {bits} activations per call", why
    return by_row_kernel(flags, bf16)


def throughput_dtype(flags: frozenset[str]) -> str:
    """The opt-in dtype for throughput on a CPU with ``flags``, by the bench's measurements
    (docs/precision-and-speed.md): int8 wherever the CPU has an int8 dot product (on AMX as fast
    as bfloat16 or faster in every case, run back to back, in less memory; ahead on AVX-512 VNNI
    + BF16), bfloat16 with native bfloat16 alone, else float32."""
    if flags & {"avx2", "avx512_vnni", "avx_vnni", "amx_int8"}:
        return "int8"
    return "bfloat16" if native_bf16_flags(flags) else "float32"


def report(flags: frozenset[str]) -> dict[str, list[dict[str, str]]]:
    """Each dtype's kernels on a CPU with ``flags``, as ``ffai engines`` prints them."""
    bf16 = native_bf16_flags(flags)
    rest = "connector, text tower" if bf16 else "other text linears"
    int8 = [Kernel(LABELS.get(p, rest), *_int8_kernel(p, k, flags, bf16)) for p, k in int8_linears(flags, bf16)]
    if bf16:  # the plans compiled_decode.py compiles: int8 by row with bfloat16 rows
        int8.append(compiled_decode_kernel(flags))
        amx = " (AMX)" if "amx_bf16" in flags else ""
        bf = Kernel("other linears", f"bfloat16 on oneDNN{amx}, weight reordered once; {FUSED_GELU}", "native bfloat16")
    else:
        bf = Kernel("other linears", "bfloat16, torch's default", "no native bfloat16: slower than float32 here")
    wide = Kernel("first 4 text layers", "float32, torch's default", "the prefill logits' margin over the gate")
    bfloat16 = [wide, bf, COMPILED_BF16_DECODE] if bf16 else [wide, bf]
    return {
        "float32": [Kernel("every linear", "float32, torch's default", "the exact path")._asdict()],
        "int8": [k._asdict() for k in int8],
        "bfloat16": [k._asdict() for k in bfloat16],
    }
