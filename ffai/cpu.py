"""What this machine's CPU can do, read once from /proc/cpuinfo, and which dtypes run fast on it.

A dtype other than float32 only pays where the CPU has instructions for it: bfloat16 matmuls
need AVX512_BF16 or AMX-BF16 (elsewhere oneDNN converts to float32 and back, measured 3-5x
slower than float32 on an AVX2-only CPU), int8 matmuls with dynamically quantised activations
need fbgemm's AVX2 or AVX-512 (VNNI) kernels. The figures behind these rules are the README's
*Precision and speed*; a CPU whose flags cannot be read makes no claim either way.

No torch import: ``ffai engines`` answers without it.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# The flags that decide the speed of a precision mode; /proc/cpuinfo's spelling. aarch64's
# "Features" line: bf16 (BFMMLA), i8mm / asimddp (int8 dot products).
RELEVANT_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimddp",
    "i8mm",
    "bf16",
)
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
INT8_FLAGS = frozenset({"avx2", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"})


@dataclass(frozen=True)
class CpuInfo:
    """A CPU's model name and its flags (``known=False``: they could not be read)."""

    model: str
    flags: frozenset[str]
    known: bool = True

    @property
    def relevant_flags(self) -> tuple[str, ...]:
        return tuple(f for f in RELEVANT_FLAGS if f in self.flags)

    @property
    def bf16_attention(self) -> str | None:
        """How the opt-in dtypes attend, if in bfloat16: "sdpa" with AMX-BF16, "blocked" with
        AVX512_BF16 alone, None (float32) elsewhere.

        torch's CPU flash attention multiplies bfloat16 blocks with oneDNN's packed brgemm only
        where oneDNN finds AMX (``cpublas::could_pack``); elsewhere it falls back to small
        unpacked gemms. Measured on an AVX512_BF16 CPU without AMX (AMD EPYC Zen 4, 2 threads,
        one 1024-patch tile's 12 heads): bfloat16 SDPA no faster than float32's (20.5 against
        19.7 ms a layer), while two bfloat16 matmuls and a softmax by blocks of query rows took
        15 ms (``vision.blocked_attention``): a real-shape int8 tile 553 -> 481 ms, a bfloat16 one
        705 -> 640 ms, its features' cosine with float32 unchanged (0.99954, 0.99993). Without
        native bfloat16, float32 SDPA. The AMX side rests on torch's code path, not on a
        measurement (no such CPU was at hand)."""
        if "amx_bf16" in self.flags:
            return "sdpa"
        if "avx512_bf16" in self.flags:
            return "blocked"
        return None

    def fast_dtypes(self) -> tuple[str, ...]:
        """The dtypes at least as fast as float32 here (float32 first), in ffai.engine.DTYPES' words."""
        fast = ["float32"]
        if not self.known or self.flags & INT8_FLAGS:
            fast.append("int8")
        if not self.known or self.flags & BF16_FLAGS:
            fast.append("bfloat16")
        return tuple(fast)

    def slow_dtype_warning(self, dtype: str) -> str | None:
        """One line saying why ``dtype`` will run slower than float32 here, or None if it will not."""
        if dtype in self.fast_dtypes():
            return None
        need = BF16_FLAGS if dtype == "bfloat16" else INT8_FLAGS
        return (
            f"--dtype {dtype} will run slower than float32 on this CPU ({self.model}): it has none of "
            f"{', '.join(sorted(need))}; float32 is the faster choice here"
        )

    def describe(self) -> str:
        """``model (flag, flag, ...)``, as the bench records beside its figures."""
        return f"{self.model} ({', '.join(self.relevant_flags) or 'no relevant flags'})"


def parse_cpuinfo(text: str) -> CpuInfo:
    """A /proc/cpuinfo text -> CpuInfo, from its first processor (x86 ``flags``, arm ``Features``)."""
    model, flags, found = "", frozenset(), False
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("flags", "features") and not found:
            flags, found = frozenset(value.split()), True
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
    return CpuInfo(model or platform.processor() or platform.machine() or "unknown CPU", flags, known=found)


@functools.cache
def host() -> CpuInfo:
    """This machine's CPU, read once per process."""
    try:
        return parse_cpuinfo(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return CpuInfo(platform.processor() or platform.machine() or "unknown CPU", frozenset(), known=False)
