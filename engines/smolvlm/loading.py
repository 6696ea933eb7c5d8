"""Loading the SmolVLM weights for a runtime: the device, glibc's heap around an opt-in dtype's
load, and the heap trimmed between stages."""

from __future__ import annotations

import functools
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator

from ffai.engine import RuntimeOptions
from ffai.errors import UsageError


def _torch_device(name: str, dtype: str = "float32") -> str:
    import torch

    if dtype == "int8":  # torch's dynamic int8 linear has CPU kernels only
        if name == "cuda":
            raise UsageError("--dtype int8 runs on the CPU only; use --device cpu or another --dtype")
        return "cpu"
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    return name


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_free_heap() -> None:
    """Hand the free pages of the heap back to the OS (glibc's malloc_trim; a no-op elsewhere).

    Each stage calls it when its work is done, so the next stage's peak does not sit on top of
    what the last one freed: a 2048 x 1536 still's preprocessing left ~100 MB free in the heap,
    which the vision tower's tiles then fragmented further. It costs ~6 ms after a still's stage
    and the next call's first touch of pages it frees."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# glibc's malloc settings around an opt-in dtype's load (``_heap_for_loading``), in bytes.
LOAD_MMAP_THRESHOLD = 1 << 20  # while loading: freed staging buffers go straight back to the OS
RUN_MMAP_THRESHOLD = 16 << 20  # afterwards: activations up to a tile's MLP (12 MiB) come from the heap
RUN_TRIM_THRESHOLD = 64 << 20  # and the heap keeps that much free at its top instead of shrinking


@contextmanager
def _heap_for_loading() -> Iterator[None]:
    """glibc's malloc tuned for an int8 or bfloat16 load, then for running (a no-op off glibc).

    By default glibc raises its mmap threshold each time a large block is freed (up to 32 MiB),
    so the float32 staging buffers these loads read through would stay in the heap once freed.
    While loading, every block of 1 MiB or more is mapped and handed back on free: peak RSS of a
    load, one real-shape tile and decode went from 719 to 544 MB for int8 (828 to 733 for
    bfloat16). Left at that, every activation of 1 MiB or more was a fresh mapping after the
    load, zeroed page by page as it was first written: an int8 frame (one tile, 32 tokens) took
    280 000 page faults and 0.63 s of system time. So the load ends by handing the heap's free
    pages back (malloc_trim) and letting blocks up to 16 MiB come from the heap, which keeps up
    to 64 MiB free instead of shrinking after every op: 5 000 faults, 0.02 s of system time, the
    frame's wall time 1.97 -> 1.37 s, for a peak 35 MB higher with the vision tower's in-place
    GELU and residual add (README, Precision and speed). float32 maps its weights, reads nothing
    through a buffer and keeps glibc's defaults."""
    import ctypes

    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        yield
        return
    mallopt(m_mmap_threshold, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        release_free_heap()
        mallopt(m_mmap_threshold, RUN_MMAP_THRESHOLD)
        mallopt(m_trim_threshold, RUN_TRIM_THRESHOLD)


def load_weights(model_dir: Path, runtime: RuntimeOptions, parts: tuple[str, ...]):
    import torch

    from ffai_smolvlm.weights import load_model

    # Thread counts are the pipeline's (ffai.pipeline.worker.set_threads), set per process before
    # any stage is built.
    device = _torch_device(runtime.device, runtime.dtype)
    with _heap_for_loading() if runtime.dtype != "float32" else nullcontext():
        return load_model(model_dir, dtype=getattr(torch, runtime.dtype), device=device, parts=parts)
