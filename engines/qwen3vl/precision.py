"""What ``--dtype`` means for Qwen3-VL on a CPU, decided in one place: :func:`plan_precision`.

A :class:`PrecisionPlan` says which layer each linear becomes (the classes of
``ffai.opt_in_linears``), which parameters are held in the low dtype and which stay float32; the
loader (``weights.load_model``) applies it as it reads the tensors, and nothing else branches on
the dtype. ``ffai.host`` reports the CPU's flags; turning them into choices is this module's.
The stage-by-stage probe behind each rule: docs/precision-and-speed.md (Qwen3-VL section).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ffai import host
from ffai.engine import DTYPES
from ffai.errors import UsageError

# How a linear layer is held (PrecisionPlan.linear), and the flags that choose: the core's.
from ffai.linear_kinds import (
    BF16_ONEDNN,
    FLOAT32,
    INT8,
    INT8_BY_ROW,
    INT8_FULL_RANGE_FLAGS,
    INT8_ONEDNN,
    PLAIN,
    native_bf16_flags,
)
from ffai.opt_in_linears import onednn_bf16 as onednn_bf16

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


@dataclass(frozen=True)
class PrecisionPlan:
    """One load's precision, made by :func:`plan_precision`."""

    dtype: str  # as asked, in ffai.engine.DTYPES' words
    weights: torch.dtype  # the low-precision parameters' dtype (float32 for int8: its linears are made from it)
    embeddings: torch.dtype  # the token embedding table's
    linears: tuple[tuple[str, str], ...]  # (module-name pattern, kind), the first match wins; none: PLAIN
    reduce_range: bool  # int8 activations quantised to 7 bits (QuantizedLinear)
    rows_dtype: torch.dtype  # RowScaledLinear multiplies several rows in this dtype
    vision_attention: torch.dtype | None  # the vision tower's SDPA dtype (None: its activations', float32)

    def linear(self, name: str) -> str:
        """The kind of layer the linear called ``name`` (``text.lm_head``, ...) becomes."""
        return next((kind for pattern, kind in self.linears if re.match(pattern, name)), PLAIN)


def plan_precision(dtype: str, cpu: host.CpuInfo | None = None) -> PrecisionPlan:
    """The plan for a CPU load in ``dtype`` on a machine with ``cpu`` (default: this one's).

    - float32: everything as the checkpoint has it; the exact path.
    - bfloat16: every linear weight, the patch embedding and the embedding table (which the LM head
      shares) in bfloat16 but the text tower's first four layers (float32); norms and so the
      residual streams float32.
      Where oneDNN multiplies bfloat16 natively each bfloat16 linear is reordered once for it.
    - int8: the text tower's linears int8 weights with one scale per output row but its first
      four layers (bfloat16 where native, else float32), multiplying bfloat16 rows where bfloat16
      is native (else only the down projections by row, in float32; the rest int8 x int8 on
      fbgemm); the LM head int8 x int8 on fbgemm (its own copy), the embedding table bfloat16.
      The vision tower in bfloat16 where native; elsewhere int8 x int8 (fbgemm) but its first
      four blocks (float32) and its mergers (by row)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    cpu = host.cpu_info() if cpu is None else cpu
    # Both torch and the flags must say so: on a real CPU they agree; a plan for another CPU's
    # flags (tests) then gets that CPU's recipe.
    bf16 = onednn_bf16() and native_bf16_flags(cpu.flags)
    if dtype == "int8":
        linears = int8_linears(cpu.flags, bf16)
    elif dtype == "bfloat16":
        linears = ((WIDE_TEXT, FLOAT32), (r".", BF16_ONEDNN)) if bf16 else ((WIDE_TEXT, FLOAT32),)
    else:
        linears = ()
    return PrecisionPlan(
        dtype=dtype,
        weights=torch.bfloat16 if dtype == "bfloat16" else torch.float32,
        # The table in bfloat16 in both: a float32 one lifted bfloat16's logits cosine by 0.00007
        # only, for 0.6 GB at 2B that int8's peak RSS target (half float32's) needs.
        embeddings=torch.float32 if dtype == "float32" else torch.bfloat16,
        linears=linears,
        reduce_range=not cpu.flags & INT8_FULL_RANGE_FLAGS,
        rows_dtype=torch.bfloat16 if bf16 else torch.float32,
        # A still's patches attend as one segment (12 288 rows at 2B's default budget): float32
        # SDPA was the largest share of its vision tower; torch's bfloat16 flash attention is fast
        # where oneDNN has AMX-BF16 tiles (SmolVLM measured it no faster on AVX512_BF16 alone).
        vision_attention=torch.bfloat16 if dtype != "float32" and "amx_bf16" in cpu.flags and bf16 else None,
    )


def int8_linears(flags: frozenset[str], bf16: bool) -> tuple[tuple[str, str], ...]:
    """int8's (module-name pattern, kind) on a CPU with ``flags`` (``bf16``: oneDNN multiplies
    bfloat16 natively), the first match winning."""
    wide = BF16_ONEDNN if bf16 else FLOAT32
    tile = INT8_ONEDNN if "amx_int8" in flags else INT8
    if bf16:
        # The vision tower whole in bfloat16: at 2B its int8 (first four blocks wide) moved the
        # features by 0.0003 only, but the prefill logits to 0.9955, under int8's 0.996 margin;
        # the text tower turns every visual token's and DeepStack feature's change into logits.
        return ((VISION, BF16_ONEDNN), (WIDE_TEXT, wide), (HEAD, INT8), (r".", INT8_BY_ROW))
    return ((WIDE_VISION, wide), (WIDE_TEXT, wide), (INT8_BY_ROW_LAYERS, INT8_BY_ROW), (VISION, tile), (r".", INT8))


def build_linear(kind: str, weight: torch.Tensor, bias: torch.Tensor | None, plan: PrecisionPlan):
    """The layer of ``kind`` for a float ``weight`` (out, in) and ``bias`` (None for PLAIN/FLOAT32:
    the loader keeps those as ``layers.Linear``)."""
    from ffai.opt_in_linears import PackedBf16Linear, QuantizedLinear, RowScaledLinear

    if kind == BF16_ONEDNN:
        return PackedBf16Linear(weight, bias)
    if kind in (INT8, INT8_ONEDNN):
        engine = "onednn" if kind == INT8_ONEDNN else "fbgemm"
        return QuantizedLinear(weight, bias, reduce_range=plan.reduce_range, engine=engine)
    if kind == INT8_BY_ROW:
        int_mm = not plan.reduce_range  # torch._int_mm's int32 sums are exact only with VNNI/AMX
        return RowScaledLinear(weight, bias, rows_dtype=plan.rows_dtype, int_mm=int_mm)
    return None


def device_for(dtype: str, device: str) -> str:
    """The torch device a load in ``dtype`` runs on: int8's kernels are the CPU's only."""
    if dtype == "int8" and device.startswith("cuda"):
        raise UsageError("--dtype int8 runs on the CPU only; use --device cpu or another --dtype")
    return "cpu" if dtype == "int8" else device
