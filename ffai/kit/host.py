"""This machine as ffai uses it: what its CPU can do, torch's thread count, glibc's malloc, and
the resident memory of a process tree.

Everything a process asks of its host or sets on it lives here, so engines and the pipeline
share one copy: the CPU's model and flags (read once from /proc/cpuinfo), the thread count a
pipeline process runs with and how its OpenMP threads wait, a malloc arena per compute thread, the heap's free pages handed back
after each stage, glibc's heap settings around a load that reads its weights through buffers,
the memory still free, and the peak RSS the bench and the memory benchmark sample. Why each setting is what it is,
with the figures behind it: docs/precision-and-speed.md, docs/how-it-works.md and docs/benchmarks.md.

This module reports and sets. Which dtypes are fast here is its one answer (``CpuInfo.fast_dtypes``,
``throughput_dtype``); which layers an engine keeps wider is the engine's (its ``precision``
module). No torch import at module import: ``ffai engines`` answers without it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

# --- the CPU ---------------------------------------------------------------------------------

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
# A dtype other than float32 only pays where the CPU has instructions for it: bfloat16 matmuls
# need native bfloat16 (elsewhere oneDNN converts to float32 and back, slower than float32),
# int8 matmuls an int8 dot product that ffai's int8 kernels use (fbgemm's AVX2 or VNNI, oneDNN's
# AMX: x86's; Arm's dot products have no fbgemm).
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
INT8_FLAGS = frozenset({"avx2", "avx512_vnni", "avx_vnni", "amx_int8"})
# Where oneDNN multiplies bfloat16 natively, so a plan packs bfloat16 linears for it (a plan also
# asks torch: ``ffai.kit.opt_in_linears.onednn_bf16``).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def native_bf16(flags: frozenset[str]) -> bool:
    return bool(flags & NATIVE_BF16_FLAGS)


@dataclass(frozen=True)
class CpuInfo:
    """A CPU's model name and its flags (``known=False``: they could not be read, and then no
    dtype is called slow)."""

    model: str
    flags: frozenset[str]
    known: bool = True

    @property
    def relevant_flags(self) -> tuple[str, ...]:
        return tuple(f for f in RELEVANT_FLAGS if f in self.flags)

    def fast_dtypes(self) -> tuple[str, ...]:
        """The dtypes at least as fast as float32 here (float32 first), in ffai.engines.contract.DTYPES'
        words: the one answer every engine and the command line give."""
        fast = ["float32"]
        if not self.known or self.flags & INT8_FLAGS:
            fast.append("int8")
        if not self.known or self.flags & BF16_FLAGS:
            fast.append("bfloat16")
        return tuple(fast)

    def throughput_dtype(self) -> str:
        """The opt-in dtype for throughput here, by the bench's measurements
        (docs/precision-and-speed.md): int8 wherever the CPU has an int8 dot product ffai's kernels
        use (as fast as bfloat16 or faster in every case measured, in less memory), bfloat16 with
        native bfloat16 alone, else float32."""
        fast = self.fast_dtypes()
        return "int8" if "int8" in fast else "bfloat16" if "bfloat16" in fast else "float32"

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
def cpu_info() -> CpuInfo:
    """This machine's CPU, read once per process."""
    try:
        return parse_cpuinfo(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return CpuInfo(platform.processor() or platform.machine() or "unknown CPU", frozenset(), known=False)


# --- threads ---------------------------------------------------------------------------------


def set_threads(threads: int) -> None:
    """Pin torch's intra-op threads (and OpenMP/MKL's) and cap glibc's malloc arenas to match
    (:func:`cap_malloc_arenas`: one for each of torch's threads and one for the thread that drives
    them). The pipeline calls it once per process, before any stage touches torch; which thread
    then runs the work is ``ffai.pipeline.compute``'s."""
    cap_malloc_arenas(threads + 1)
    share_cores()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch  # only processes that ask for a thread count pay for the import here

    torch.set_num_threads(threads)


# OpenMP's threads (torch's, and inductor's compiled code) spin at a barrier before they sleep:
# alone on its cores that saves a wake-up, but beside another busy program a spinning thread burns
# the slice its descheduled peer needs (docs/precision-and-speed.md, "Cores shared").
OPENMP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}
_OPENMP_WAIT_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def share_cores() -> None:
    """Set OpenMP's wait policy for this process and the ones it starts (``OPENMP_WAIT``),
    unless the user chose one. OpenMP reads it when torch loads it: call before importing torch."""
    if not any(knob in os.environ for knob in _OPENMP_WAIT_KNOBS):
        os.environ.update(OPENMP_WAIT)


# --- glibc's malloc --------------------------------------------------------------------------

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


@functools.cache
def _glibc(name: str) -> Callable[..., int] | None:
    """glibc's function ``name`` (``mallopt``, ``malloc_trim``); None off glibc, where every
    call here is then a no-op and malloc is left as it is."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def cap_malloc_arenas(arenas: int) -> bool:
    """At most ``arenas`` glibc malloc arenas in this process (glibc's own cap is eight per core);
    returns whether it applied (glibc only; elsewhere malloc is left as it is).

    Threads that allocate from one arena wait on its lock, and torch's threads allocate at every
    call (fbgemm's and oneDNN's per-call buffers): the compiled int8 decode step waited on that
    lock with the thread driving it and torch's second thread in one arena (docs/benchmarks.md).
    What a thread frees stays in its arena, so no more arenas than the threads that compute. A
    thread keeps the arena of its first allocation, so this runs before torch starts its threads.
    """
    mallopt = _glibc("mallopt")
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, max(1, arenas)))


def release_free_heap() -> None:
    """Hand the free pages of the heap back to the OS (glibc's malloc_trim; a no-op elsewhere).

    The pipeline calls it when a stage's call returns, so the next stage's peak does not sit on
    top of what the last one freed (a still's preprocessing leaves its resized copies free in the
    heap, which the vision tower's tiles would fragment further)."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


# glibc's malloc settings around a load that reads its weights through buffers, in bytes.
LOAD_MMAP_THRESHOLD = 1 << 20  # while loading: freed staging buffers go straight back to the OS
RUN_MMAP_THRESHOLD = 16 << 20  # afterwards: activations up to a tile's MLP (12 MiB) come from the heap
RUN_TRIM_THRESHOLD = 64 << 20  # and the heap keeps that much free at its top instead of shrinking


@contextmanager
def heap_for_loading() -> Iterator[None]:
    """glibc's malloc tuned for a load that reads (casts, quantises) its weights through staging
    buffers, then for running (a no-op off glibc).

    By default glibc raises its mmap threshold each time a large block is freed, so the staging
    buffers would stay in the heap once freed: while loading, every block of 1 MiB or more is
    mapped and handed back on free. Left at that, every activation of 1 MiB or more would be a
    fresh mapping, zeroed page by page as it is first written; so the load ends by trimming the
    heap and letting blocks up to 16 MiB come from it, with 64 MiB kept free at its top. A load
    that maps its weights (float32) reads nothing through a buffer and keeps glibc's defaults."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        release_free_heap()
        mallopt(M_MMAP_THRESHOLD, RUN_MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, RUN_TRIM_THRESHOLD)


# --- resident memory -------------------------------------------------------------------------

# ``ru_maxrss`` covers one process (or the largest child), not a tree of workers alive at the
# same time; the bench and the memory benchmark need the sum over the tree at its peak (Linux).
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


MEMINFO = Path("/proc/meminfo")


def available_memory(device: str = "cpu") -> int | None:
    """Bytes a new allocation can take without swapping: the kernel's MemAvailable on the CPU,
    the free device memory on a GPU; None where it cannot be told."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants right now."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
        stack += _children(p)
    return total


class PeakRSS:
    """Samples ``tree_rss(pid)`` every ``interval`` seconds in a thread; ``peak`` is the max."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_measured(cmd: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, int, float]:
    """Run ``cmd``; return its completed process, the tree's peak RSS in bytes, and seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    with PeakRSS(proc.pid) as peak:
        out, err = proc.communicate()
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    return done, peak.peak, time.perf_counter() - start
