"""What ``--dtype`` means for Qwen3-VL on a CPU, decided in one place: :func:`plan_precision`.

A :class:`PrecisionPlan` says which layer each linear becomes (the classes of
``ffai.kit.opt_in_linears``), which parameters are held in the low dtype and which stay float32; the
loader (``weights.load_model``) applies it as it reads the tensors, and nothing else branches on
the dtype. ``ffai.kit.host`` reports the CPU's flags; the rules that turn them into choices are
``kernels.py``'s (torch-free, so ``ffai engines`` reports the same choices); this module builds
the plan and the layers from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ffai.engines.contract import DTYPES
from ffai.engines.qwen3vl.kernels import BF16_ONEDNN as BF16_ONEDNN
from ffai.engines.qwen3vl.kernels import FLOAT32 as FLOAT32
from ffai.engines.qwen3vl.kernels import HEAD as HEAD
from ffai.engines.qwen3vl.kernels import INT8 as INT8
from ffai.engines.qwen3vl.kernels import INT8_BY_ROW as INT8_BY_ROW
from ffai.engines.qwen3vl.kernels import INT8_BY_ROW_LAYERS as INT8_BY_ROW_LAYERS
from ffai.engines.qwen3vl.kernels import INT8_FULL_RANGE_FLAGS as INT8_FULL_RANGE_FLAGS
from ffai.engines.qwen3vl.kernels import INT8_ONEDNN as INT8_ONEDNN
from ffai.engines.qwen3vl.kernels import MERGERS as MERGERS
from ffai.engines.qwen3vl.kernels import PLAIN as PLAIN
from ffai.engines.qwen3vl.kernels import VISION as VISION
from ffai.engines.qwen3vl.kernels import WIDE_TEXT as WIDE_TEXT
from ffai.engines.qwen3vl.kernels import WIDE_VISION as WIDE_VISION
from ffai.engines.qwen3vl.kernels import bfloat16_linears, int8_linears, native_bf16_flags, vision_attention_bf16
from ffai.errors import UsageError
from ffai.kit import host
from ffai.kit.opt_in_linears import onednn_bf16 as onednn_bf16


@dataclass(frozen=True)
class PrecisionPlan:
    """One load's precision, made by :func:`plan_precision`."""

    dtype: str  # as asked, in ffai.engines.contract.DTYPES' words
    weights: torch.dtype  # the low-precision parameters' dtype (float32 for int8: its linears are made from it)
    embeddings: torch.dtype  # the token embedding table's
    linears: tuple[tuple[str, str], ...]  # (module-name pattern, kind), the first match wins; none: PLAIN
    reduce_range: bool  # int8 activations quantised to 7 bits (QuantizedLinear)
    rows_dtype: torch.dtype  # RowScaledLinear multiplies several rows in this dtype
    vision_attention: torch.dtype | None  # the vision tower's SDPA dtype (None: its activations', float32)
    kv_cache: torch.dtype | None = None  # the text tower's cache and decode attention (None: float32)

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
      four blocks (float32) and its mergers (by row).
    - bfloat16 and int8 where bfloat16 is native: the KV cache bfloat16, and a decode step's
      attention over it."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    cpu = host.cpu_info() if cpu is None else cpu
    # Both torch and the flags must say so: on a real CPU they agree; a plan for another CPU's
    # flags (tests) then gets that CPU's recipe.
    bf16 = onednn_bf16() and native_bf16_flags(cpu.flags)
    if dtype == "int8":
        linears = int8_linears(cpu.flags, bf16)
    elif dtype == "bfloat16":
        linears = bfloat16_linears(bf16)
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
        vision_attention=torch.bfloat16 if dtype != "float32" and vision_attention_bf16(cpu.flags, bf16) else None,
        # A still's cache is held from its prefill to its last token, a large share of the peak:
        # bfloat16 where native, read by the decode steps only (a prefill attends as computed).
        kv_cache=torch.bfloat16 if dtype != "float32" and bf16 else None,
    )


def build_linear(kind: str, weight: torch.Tensor, bias: torch.Tensor | None, plan: PrecisionPlan):
    """The layer of ``kind`` for a float ``weight`` (out, in) and ``bias`` (None for PLAIN/FLOAT32:
    the loader keeps those as ``layers.Linear``)."""
    from ffai.kit.opt_in_linears import OneDnnInt8Linear, PackedBf16Linear, QuantizedLinear, RowScaledLinear

    if kind == BF16_ONEDNN:
        return PackedBf16Linear(weight, bias)
    if kind == INT8:
        return QuantizedLinear(weight, bias, reduce_range=plan.reduce_range)
    if kind == INT8_ONEDNN:
        return OneDnnInt8Linear(weight, bias)
    if kind == INT8_BY_ROW:
        int_mm = not plan.reduce_range  # torch._int_mm's int32 sums are exact only with VNNI/AMX
        return RowScaledLinear(weight, bias, rows_dtype=plan.rows_dtype, int_mm=int_mm)
    return None


def device_for(dtype: str, device: str) -> str:
    """The torch device a load in ``dtype`` runs on: int8's kernels are the CPU's only."""
    if dtype == "int8" and device.startswith("cuda"):
        raise UsageError("--dtype int8 runs on the CPU only; use --device cpu or another --dtype")
    return "cpu" if dtype == "int8" else device
