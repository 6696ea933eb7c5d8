"""The kinds of linear layer an opt-in dtype's plan chooses from, the CPU flags that decide between
them, and how ``ffai engines`` words them: names only, no torch, so an engine's choices are reported
without importing it. The layers themselves are ``ffai.kit.opt_in_linears``; each engine's precision
module says which of its linears becomes which.
"""

from __future__ import annotations

from typing import NamedTuple

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


class Kernel(NamedTuple):
    """One group of layers, as ``ffai engines`` prints it: what runs them, and why."""

    layers: str
    kernel: str
    why: str


def int8_bits(flags: frozenset[str]) -> str:
    """How many bits a call's int8 activations use on a CPU with ``flags``, in words."""
    return "8-bit" if flags & INT8_FULL_RANGE_FLAGS else "7-bit (16-bit sums saturate)"


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


def compiled_row_kernel(threads: int, flags: frozenset[str]) -> str:
    """The int8 kernel for a decode row in ``--compile``'s step (``ffai.kit.compiled_decode``) at
    ``threads`` of torch's threads on a CPU with ``flags``: inductor's own float32 sums over the
    int8 weights (``"sums"``) at two threads or more on CPUs without AMX, where they keep every
    call inside the program (an fbgemm call leaves it, and the other threads wait through its
    serial part) and need no packed copy of the weights; fbgemm's int8 dot products elsewhere: at
    one thread, where the step is compute-bound, and on AMX CPUs at any count, whose cores
    ran the sums' loops slower than fbgemm at two threads too (docs/benchmarks.md)."""
    return "sums" if threads > 1 and "amx_int8" not in flags else "fbgemm"


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
        "no Python between the ops; for video and batches",
    )
