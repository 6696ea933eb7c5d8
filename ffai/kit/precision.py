"""What ``--dtype`` means on this machine, in one shape for every engine: a :class:`PrecisionPlan`.

A plan says on which torch device the model runs, what each linear becomes (the kinds of
``ffai.kit.linear_kinds``, built by :func:`opt_in_linear` from ``ffai.kit.opt_in_linears``), which
parameters stay float32, how the vision tower and the text tower's prefill attend, the KV cache's
dtype and whether the token embedding table stays in its file. The loader (``ffai.kit.loading``)
reads tensors and applies a plan, and the towers take what it says: nothing else branches on the
dtype.

The plan's shape and the facts it rests on (:class:`Machine`: the device, whether oneDNN
multiplies bfloat16 natively, the CPU's flags) are the kit's; which of its layers an engine keeps
wider, and how its vision tower attends fastest, are the engine's own measured choices, made in
its ``precision`` module from a :class:`Machine`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ffai.engines.contract import DTYPES
from ffai.errors import UsageError
from ffai.kit import host
from ffai.kit.linear_kinds import BF16_ONEDNN, INT8, INT8_BY_ROW, INT8_FULL_RANGE_FLAGS, INT8_ONEDNN, PLAIN
from ffai.kit.opt_in_linears import OneDnnInt8Linear, PackedBf16Linear, QuantizedLinear, RowScaledLinear, onednn_bf16


class VisionAttention(NamedTuple):
    """How a vision tower attends: in ``dtype`` (None: the activations' own), by torch's SDPA
    (``block`` None) or by blocks of ``block`` query rows."""

    dtype: torch.dtype | None = None
    block: int | None = None


EXACT_ATTENTION = VisionAttention()  # SDPA in the activations' own dtype: float32's exact path


class Int8(NamedTuple):
    """How int8 linears run here."""

    reduce_range: bool  # activations quantised to 7 bits (QuantizedLinear)
    rows_dtype: torch.dtype  # RowScaledLinear multiplies several rows in this dtype


@dataclass(frozen=True)
class PrecisionPlan:
    """One load's precision (:meth:`Machine.plan` makes it)."""

    dtype: str  # as asked, in ffai.engines.contract.DTYPES' words
    device: str  # the torch device the weights load to and the model runs on
    weights: torch.dtype  # what tensors are read as; int8's linears are read as float32, then made int8
    embeddings: torch.dtype  # the token embedding table's
    float32_parts: tuple[str, ...]  # parts whose parameters other than linears' and convolutions' stay float32
    linears: tuple[tuple[str, str], ...]  # (module-name pattern, kind), the first match wins; none: PLAIN
    int8: Int8 | None  # how int8 layers run (None: the plan has none)
    attention: VisionAttention  # the vision tower's
    text_prefill: torch.dtype | None  # the text tower's attention over a prefill's rows (None: its own dtype)
    kv_cache: torch.dtype | None  # the text tower's cache and a decode step's attention (None: its own dtype)
    embeddings_in_file: bool  # the token embedding table is read from its file a lookup at a time
    staged: bool  # weights are read through staging buffers (cast, quantised), not mapped

    def linear(self, name: str) -> str:
        """The kind of layer the linear called ``name`` (``text.lm_head``, ...) becomes."""
        return next((kind for pattern, kind in self.linears if re.match(pattern, name)), PLAIN)


@dataclass(frozen=True)
class Machine:
    """What a plan for ``dtype`` rests on: the torch ``device``, this CPU (``cpu``), and whether
    oneDNN multiplies bfloat16 natively there (``native_bf16``: torch and the flags must both say
    so; on a real CPU they agree, and a plan for another CPU's flags, as tests and emulation make,
    then gets that CPU's recipe)."""

    dtype: str
    device: str
    cpu: host.CpuInfo
    native_bf16: bool

    @classmethod
    def of(cls, dtype: str, device: str = "cpu", cpu: host.CpuInfo | None = None) -> Machine:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        cpu = host.cpu_info() if cpu is None else cpu
        device = torch_device(device, dtype)
        return cls(dtype, device, cpu, onednn_bf16(device) and host.native_bf16(cpu.flags))

    @property
    def flags(self) -> frozenset[str]:
        return self.cpu.flags

    @property
    def on_cpu(self) -> bool:
        return torch.device(self.device).type == "cpu"

    @property
    def opt_in(self) -> bool:
        return self.dtype != "float32"

    def plan(
        self,
        linears: tuple[tuple[str, str], ...],
        *,
        float32_parts: tuple[str, ...] = (),
        embeddings: torch.dtype = torch.float32,
        attention: VisionAttention = EXACT_ATTENTION,
        text_prefill: torch.dtype | None = None,
        kv_cache: torch.dtype | None = None,
        embeddings_in_file: bool = False,
    ) -> PrecisionPlan:
        """The plan for this machine with an engine's choices; int8's settings follow the CPU."""
        int8 = None
        if self.dtype == "int8":
            # u8 x s8 summed straight into 32 bits lets activations use all 8 bits (linear_kinds.INT8_FULL_RANGE_FLAGS).
            int8 = Int8(
                reduce_range=not self.flags & INT8_FULL_RANGE_FLAGS,
                rows_dtype=torch.bfloat16 if self.native_bf16 else torch.float32,
            )
        return PrecisionPlan(
            dtype=self.dtype,
            device=self.device,
            weights=torch.bfloat16 if self.dtype == "bfloat16" else torch.float32,
            embeddings=embeddings,
            float32_parts=float32_parts,
            linears=linears,
            int8=int8,
            attention=attention,
            text_prefill=text_prefill,
            kv_cache=kv_cache,
            embeddings_in_file=embeddings_in_file,
            staged=self.dtype != "float32",
        )


def torch_device(name: str, dtype: str) -> str:
    """The torch device a load in ``dtype`` asked for ``name`` (``--device``: auto, cpu, cuda) runs
    on, or a one-line UsageError: int8's kernels are the CPU's (fbgemm's, x86's), and cuda needs a
    CUDA device."""
    if dtype == "int8":
        if name.startswith("cuda"):
            raise UsageError("--dtype int8 runs on the CPU only; use --device cpu or another --dtype")
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise UsageError("--dtype int8 needs torch's fbgemm kernels (x86 CPUs), which this torch lacks")
        return "cpu"
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    return name


def opt_in_linear(plan: PrecisionPlan, name: str, weight: torch.Tensor, bias, parts: tuple[int, ...]) -> nn.Module:
    """The layer ``plan`` makes of the linear ``name`` from its float weight and bias."""
    kind = plan.linear(name)
    if kind == INT8:
        return QuantizedLinear(weight, bias, reduce_range=plan.int8.reduce_range, parts=parts)
    if kind == INT8_ONEDNN:
        return OneDnnInt8Linear(weight, bias, parts)
    if kind == INT8_BY_ROW:
        int8 = plan.int8
        # torch._int_mm's int32 sums are exact only where u8 x s8 sums into 32 bits (VNNI, AMX).
        return RowScaledLinear(weight, bias, rows_dtype=int8.rows_dtype, int_mm=not int8.reduce_range, parts=parts)
    if kind == BF16_ONEDNN:
        return PackedBf16Linear(weight, bias, parts)
    raise ValueError(f"{name}: no layer to build for a linear held as {kind!r}")
