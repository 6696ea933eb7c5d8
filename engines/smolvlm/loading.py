"""Loading the SmolVLM weights for a runtime: the device, and glibc's heap around an opt-in
dtype's load (``ffai.host.heap_for_loading``)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from ffai import host
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


def load_weights(model_dir: Path, runtime: RuntimeOptions, parts: tuple[str, ...]):
    import torch

    from ffai_smolvlm.weights import load_model

    # Thread counts are the pipeline's (ffai.host.set_threads), set per process before
    # any stage is built.
    device = _torch_device(runtime.device, runtime.dtype)
    with host.heap_for_loading() if runtime.dtype != "float32" else nullcontext():
        return load_model(model_dir, dtype=getattr(torch, runtime.dtype), device=device, parts=parts)
