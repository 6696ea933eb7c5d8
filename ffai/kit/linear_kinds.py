"""The kinds of linear layer an opt-in dtype's plan chooses from, and the CPU flags that decide
between them: names only, no torch, so ``ffai engines`` can report an engine's choices without
importing it. The layers themselves are ``ffai.kit.opt_in_linears``; each engine's precision plan
says which of its linears becomes which.
"""

from __future__ import annotations

PLAIN = "plain"  # the engine's own linear, in the plan's ``weights`` dtype
INT8 = "int8"  # QuantizedLinear on fbgemm: int8 weight, a call's activations quantised by one range
INT8_ONEDNN = "int8 oneDNN"  # OneDnnInt8Linear: oneDNN's int8 matmul (a tile's rows on VNNI/AMX CPUs)
INT8_BY_ROW = "int8 by row"  # RowScaledLinear: a plain int8 weight, no activation range shared by rows
BF16_ONEDNN = "bfloat16 oneDNN"  # PackedBf16Linear: the weight reordered once for oneDNN's kernel
FLOAT32 = "float32"  # the engine's own linear in float32, whatever the plan's ``weights`` dtype

# int8 dot products that sum u8 x s8 straight into 32 bits: activations may use all 8 bits.
# Elsewhere (AVX2's vpmaddubsw saturates in 16 bits) they keep to 7.
INT8_FULL_RANGE_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
# Where oneDNN's int8 matmul (OneDnnInt8Linear) runs a tile's rows: its u8 x s8 sums are exact
# (32-bit) with AVX-512 VNNI and AMX-INT8, and it beat fbgemm there (docs/precision-and-speed.md).
ONEDNN_INT8_FLAGS = frozenset({"avx512_vnni", "amx_int8"})
# Where oneDNN multiplies bfloat16 natively, by /proc/cpuinfo's flags (a plan also asks torch:
# ``opt_in_linears.onednn_bf16``).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def native_bf16_flags(flags: frozenset[str]) -> bool:
    return bool(flags & NATIVE_BF16_FLAGS)


def by_row_kernel(flags: frozenset[str], bf16: bool) -> tuple[str, str]:
    """What ``INT8_BY_ROW`` (``opt_in_linears.RowScaledLinear``) runs on a CPU with ``flags``
    (``bf16``: its rows are bfloat16), in ``ffai engines``' words: (kernel, why)."""
    rows = "bfloat16" if bf16 else "float32"
    if bf16:
        one = "torch._weight_int8pack_mm"
    elif flags & INT8_FULL_RANGE_FLAGS:
        one = "torch._int_mm, 8-bit by its own range"
    else:  # oneDNN's s8 x s8 saturates in 16-bit sums there (not exact)
        one = "float32 too"
    why = "activations unquantised: the prefill logits' margin" if bf16 else "no activation range shared by rows"
    return f"int8 weight x {rows} rows; one row: {one}", why
