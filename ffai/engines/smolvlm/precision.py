"""What ``--dtype`` means for SmolVLM on this machine, decided in one place: :func:`plan_precision`.

A :class:`PrecisionPlan` says which layer each linear becomes, which parameters stay float32,
how the vision tower attends, whether the token embedding table stays in its file, and the
torch device. The loader (``weights.load_model``) reads tensors and applies a plan, and the
towers take what it says; nothing else branches on the dtype. ``ffai.kit.host`` only reports the
CPU's flags: turning them into choices is this engine's business. The measurements behind each
rule: docs/precision-and-speed.md and docs/benchmarks.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ffai.engines.contract import DTYPES
from ffai.errors import UsageError
from ffai.kit import host
from ffai.kit.opt_in_linears import onednn_bf16 as onednn_bf16

# The kinds of layer (re-exported for the loader) and which int8 linear is which, on any CPU.
from .kernels import BF16_ONEDNN as BF16_ONEDNN
from .kernels import FLOAT32 as FLOAT32
from .kernels import INT8 as INT8
from .kernels import INT8_BY_ROW as INT8_BY_ROW
from .kernels import INT8_FULL_RANGE_FLAGS, PLAIN, bfloat16_linears, int8_linears, native_bf16_flags
from .kernels import INT8_ONEDNN as INT8_ONEDNN

# Query rows per block where the vision tower attends by blocks (vision.blocked_attention).
ATTENTION_BLOCK = 128


class Attention(NamedTuple):
    """How the vision tower attends: in ``dtype`` (None: the activations' own), by torch's SDPA
    (``block`` None) or by blocks of ``block`` query rows (``vision.blocked_attention``)."""

    dtype: torch.dtype | None = None
    block: int | None = None


EXACT_ATTENTION = Attention()  # SDPA in the activations' own dtype: float32's exact path


class Int8(NamedTuple):
    """How int8 linears run here."""

    reduce_range: bool  # activations quantised to 7 bits (QuantizedLinear)
    rows_dtype: torch.dtype  # RowScaledLinear multiplies several rows in this dtype


@dataclass(frozen=True)
class PrecisionPlan:
    """One load's precision, made by :func:`plan_precision`."""

    dtype: str  # as asked, in ffai.engines.contract.DTYPES' words
    device: str  # the torch device the weights load to and the model runs on
    weights: torch.dtype  # what tensors are read as; int8's linears are read as float32, then made int8
    float32_parts: tuple[str, ...]  # parts ("text") whose parameters other than linear weights stay float32
    linears: tuple[tuple[str, str], ...]  # (module-name pattern, kind), the first match wins; none: PLAIN
    int8: Int8 | None  # how int8 layers run (None: the plan has none)
    attention: Attention  # the vision tower's
    text_prefill: torch.dtype | None  # the text tower's attention over a prefill's rows (None: its own dtype)
    embeddings_in_file: bool  # the token embedding table is read from its file a lookup at a time
    staged: bool  # weights are read through staging buffers (cast, quantised), not mapped

    def linear(self, name: str) -> str:
        """The kind of layer the linear called ``name`` (``text.lm_head``, ...) becomes."""
        return _kind(self.linears, name)


def plan_precision(dtype: str, device: str = "cpu", cpu: host.CpuInfo | None = None) -> PrecisionPlan:
    """The plan for a load in ``dtype`` (float32, bfloat16, int8) on ``device`` (auto, cpu, cuda)
    on a machine with ``cpu`` (default: this one's, ``ffai.kit.host.cpu_info``). Whether oneDNN
    multiplies bfloat16 natively is asked of torch (:func:`onednn_bf16`) and of ``cpu``'s flags.

    - float32: everything as the checkpoint has it; the exact path.
    - bfloat16: every linear weight in bfloat16 but the text tower's first four layers' (float32,
      ``kernels.bfloat16_linears``), the text tower's other parameters (embedding table, RMSNorm
      weights) in float32, so its residual stream, norms and attention stay float32: a bfloat16
      stream rounded 30 layers' sums to 8 bits of mantissa, under the gate. Where oneDNN has
      native bfloat16, each bfloat16 linear is reordered once for its kernel.
    - int8: every linear's weight in int8 (CPU only) but the first four layers of each tower
      (bfloat16 or float32), held as ``kernels.int8_linears`` says for this CPU; the rest float32.

    In both opt-in dtypes on the CPU the vision tower attends as the CPU runs it fastest (and the
    text tower's prefill in bfloat16 with AMX-BF16), and the embedding table stays in its file
    where the LM head has its own copy."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    cpu = host.cpu_info() if cpu is None else cpu
    device = _torch_device(device, dtype)
    on_cpu = torch.device(device).type == "cpu"
    # Both torch and the flags must say so: on a real CPU they agree; a plan for another CPU's
    # flags (tests, emulation) then gets that CPU's recipe.
    native_bf16 = onednn_bf16(device) and native_bf16_flags(cpu.flags)
    int8 = None
    if dtype == "int8":
        linears = int8_linears(cpu.flags, native_bf16)
        int8 = Int8(
            reduce_range=not cpu.flags & INT8_FULL_RANGE_FLAGS,
            rows_dtype=torch.bfloat16 if native_bf16 else torch.float32,
        )
    elif dtype == "bfloat16":
        linears = bfloat16_linears(native_bf16)
    else:
        linears = ()
    return PrecisionPlan(
        dtype=dtype,
        device=device,
        weights=torch.bfloat16 if dtype == "bfloat16" else torch.float32,
        float32_parts=("text",) if dtype == "bfloat16" else (),
        linears=linears,
        int8=int8,
        attention=_attention(dtype, on_cpu, cpu),
        # AMX-BF16 runs torch's bfloat16 flash attention on its tiles: a long prefill faster at a
        # cosine cost far under the gates' (docs/benchmarks.md has the figures).
        text_prefill=torch.bfloat16 if dtype != "float32" and on_cpu and "amx_bf16" in cpu.flags else None,
        # Left in the file only where nothing reads the table whole: the head has its own copy.
        embeddings_in_file=on_cpu and _kind(linears, "text.lm_head") != PLAIN,
        staged=dtype != "float32",
    )


def _kind(linears: tuple[tuple[str, str], ...], name: str) -> str:
    return next((kind for pattern, kind in linears if re.match(pattern, name)), PLAIN)


def _torch_device(name: str, dtype: str) -> str:
    if dtype == "int8":  # torch's dynamic int8 linear has CPU kernels only
        if name.startswith("cuda"):
            raise UsageError("--dtype int8 runs on the CPU only; use --device cpu or another --dtype")
        return "cpu"
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    return name


def _attention(dtype: str, on_cpu: bool, cpu: host.CpuInfo) -> Attention:
    """float32 and every device but the CPU: SDPA in the activations' own dtype (the exact path).
    The opt-in dtypes on the CPU: bfloat16 SDPA with AMX-BF16; bfloat16 by blocks with
    AVX512_BF16 alone, since torch's CPU flash attention packs its bfloat16 blocks for oneDNN's
    brgemm only where oneDNN finds AMX; float32 SDPA without native bfloat16."""
    if dtype == "float32" or not on_cpu:
        return EXACT_ATTENTION
    if "amx_bf16" in cpu.flags:
        return Attention(torch.bfloat16)
    if "avx512_bf16" in cpu.flags:
        return Attention(torch.bfloat16, ATTENTION_BLOCK)
    return Attention(torch.float32)
