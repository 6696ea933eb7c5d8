"""Loading the SmolVLM weights for a runtime: its precision plan (``precision.plan_precision``:
the device, what each layer becomes), read under glibc's heap settings for a load through staging
buffers where the plan reads that way (``ffai.kit.host.heap_for_loading``)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from ffai.engines.contract import RuntimeOptions
from ffai.kit import host


def load_weights(model_dir: Path, runtime: RuntimeOptions, parts: tuple[str, ...]):
    from ffai.engines.smolvlm import compiled_decode
    from ffai.engines.smolvlm.precision import plan_precision
    from ffai.engines.smolvlm.weights import load_model, weight_files

    # Thread counts are the pipeline's (ffai.kit.host.set_threads), set per process before
    # any stage is built.
    plan = plan_precision(runtime.dtype, runtime.device)
    with host.heap_for_loading() if plan.staged else nullcontext():
        model = load_model(model_dir, plan, parts=parts)
    if model.text is not None and runtime.compile:
        compiled_decode.attach(model.text, weight_files(model_dir), plan.dtype)
    return model
