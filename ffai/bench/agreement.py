"""The bench's untimed precision run: ffai in ``--dtype`` against ffai in float32, one case per process.

    python -m ffai.bench.agreement CASE --model DIR [--engine NAME] --dtype D [--cores N] [--clip MP4]

prints one JSON object on stdout. The timed arms stay as they are (one model, one dtype, their
own peak RSS); this process loads ffai's engine twice, in ``--dtype`` and in float32 (the
float32 engine is bit-identical to the reference, which the float32 bench's correctness gate
and the oracle tests keep), and for each item of the case, through the engine's probes (its
bench hooks, ``ffai.bench.hooks``; an engine on the kit takes ``ffai.bench.engine_hooks.KitBench``):

- the image features of every tile (SmolVLM: vision tower + connector output) in both dtypes,
  and their cosine similarity;
- the prefill logits (the next-token distribution after the prompt) in both, and their cosine;
- the case's 32 forced greedy tokens in both (the gates compare them position by position);
- in ``--dtype``: the time to the first token (embedding + prefill) and the decode time per
  token, from the timestamps the engine's per-token callback gives as each token comes (after
  one untimed warm-up on the first item, as the timed arms warm up). Reported: the median over
  items of the first, the median over all decode steps of the second (on shared cores a step
  that lost its core to another process is an outlier, not the decode rate).

With ``--dtype float32`` only one model is loaded and only the timings are measured.

The same process measures the machine's memory bandwidth (a plain ``torch.sum`` over a 500 MB
float32 tensor, best of a few) and the decode floor: the weights a decode step reads (the
engine's ``decode_weights``; SmolVLM's: the text tower and the LM head) at the dtype's width,
read once per token at that bandwidth.

Threads: as many as ffai's text stage gets on these cores (``ffai.run.captioner.pipeline_config``),
so the decode time per token is the timed ffai arm's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ffai.bench import cases
from ffai.bench.arms import print_result
from ffai.engines.contract import DTYPES, Engine, RuntimeOptions

if TYPE_CHECKING:  # pragma: no cover
    import torch

BANDWIDTH_BYTES = 500_000_000  # the 500 MB
BANDWIDTH_REPEATS = 5


def cosine(a: "torch.Tensor", b: "torch.Tensor") -> float:
    """Cosine similarity of two tensors taken as flat vectors, in float64 whatever their dtype."""
    import torch

    x, y = a.detach().flatten().double(), b.detach().flatten().double()
    return float(torch.dot(x, y) / (x.norm() * y.norm()).clamp_min(torch.finfo(torch.float64).tiny))


def tile_cosines(ours: "torch.Tensor", theirs: "torch.Tensor") -> list[float]:
    """(n_tiles, image_seq_len, D) image embeddings in two dtypes -> one cosine per tile."""
    if ours.shape != theirs.shape:
        raise ValueError(f"image embeddings of shapes {tuple(ours.shape)} and {tuple(theirs.shape)}")
    return [cosine(a, b) for a, b in zip(ours, theirs)]


def bandwidth(n_bytes: int = BANDWIDTH_BYTES, repeats: int = BANDWIDTH_REPEATS) -> float:
    """Bytes per second a plain ``torch.sum`` reads over an ``n_bytes`` float32 tensor (best run)."""
    import torch

    x = torch.ones(n_bytes // 4, dtype=torch.float32)  # written, so every page is resident
    x.sum()  # one untimed pass: the threads start and the pages are mapped
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * x.element_size() / best


def weight_bytes(dtype: str) -> int:
    """Bytes per weight in ``dtype`` (int8's per-row scales, one float per row, left out)."""
    import torch

    return getattr(torch, dtype).itemsize


def decode_floor(weights: int, dtype: str, bytes_per_s: float) -> dict:
    """The decode floor: ``weights`` (those one decode step reads) at ``dtype``'s width, read
    once at ``bytes_per_s``."""
    n_bytes = weights * weight_bytes(dtype)
    ms = round(1e3 * n_bytes / bytes_per_s, 3)
    return {"bytes": n_bytes, "bandwidth_gb_s": round(bytes_per_s / 1e9, 2), "ms": ms}


def text_threads(engine: Engine, model_dir: Path, runtime: RuntimeOptions, cores: int) -> int:
    """Torch threads in the process that holds ffai's last (decoding) stage on ``cores`` cores."""
    from ffai.run.captioner import pipeline_config

    config = pipeline_config(engine.stages(), model_dir, runtime, cores)
    threads = {p.name: p.threads for p in config.processes}
    return threads[config.stages[-1].process]


def run(
    case: str,
    model_dir: Path,
    *,
    engine: str | None = None,
    dtype: str,
    cores: int | None = None,
    clip: Path | None = None,
    compile: bool = False,
    batch: int = 1,
) -> dict:
    """The case's items in ``dtype`` (timed per token; ``compile``: with its compiled parts) and,
    unless float32, in float32 too; with ``batch`` > 1, a decode step of that many rows timed
    against a lone one (per row: what a window's token costs when windows decode together)."""
    from ffai.bench.hooks import hooks_for
    from ffai.engines import registry
    from ffai.kit.host import set_threads
    from ffai.run.captioner import available_cores
    from ffai.run.inline import InlineEngine

    found = registry.get_engine(engine)
    probes = hooks_for(found)
    runtime = RuntimeOptions(dtype=dtype, device="cpu", compile=compile)
    threads = text_threads(found, model_dir, runtime, cores or available_cores())
    set_threads(threads)
    bytes_per_s = bandwidth()
    ours = InlineEngine(found, model_dir, runtime)
    exact = (
        None if dtype == "float32" else InlineEngine(found, model_dir, RuntimeOptions(dtype="float32", device="cpu"))
    )
    options = cases.decoding()
    items = list(cases.clip_items(clip)) if case == "clip" else cases.items(case)
    tokens: dict[str, dict[str, list[int]]] = {"ours": {}, "float32": {}}
    tiles: dict[str, list[float]] = {}
    logits: dict[str, float] = {}
    first_s, steps_s = [], []
    # One untimed pass over the first item, as the timed arms warm up: a fresh model's first
    # prefill and decode steps pay for one-off kernel and buffer set-up.
    probes.timed_tokens(ours, items[0].request(options))
    for item in items:
        request = item.request(options)
        ids, first, steps = probes.timed_tokens(ours, request)
        tokens["ours"][item.id] = ids
        first_s.append(first)
        steps_s += steps
        if exact is None:
            continue
        features, prefill = probes.features_and_logits(ours, request)
        exact_features, exact_prefill = probes.features_and_logits(exact, request)
        # Unrounded: the gate compares them with its bound.
        tiles[item.id] = tile_cosines(features, exact_features)
        logits[item.id] = cosine(prefill, exact_prefill)
        tokens["float32"][item.id] = list(exact(request).token_ids)
    return {
        "case": case,
        "dtype": dtype,
        "threads": threads,
        "tile_cosines": tiles or None,
        "logits_cosines": logits or None,
        "tokens": tokens["ours"],
        "float32_tokens": tokens["float32"] or None,
        "prefill_s": round(statistics.median(first_s), 4),
        "decode_ms_per_token": round(1e3 * statistics.median(steps_s), 3) if steps_s else None,
        "floor": decode_floor(probes.decode_weights(model_dir), dtype, bytes_per_s),
        "batch_decode": _batch_decode(probes, ours, items[0].request(options), batch),
    }


def _batch_decode(probes, model, request, batch: int) -> dict | None:
    """Per-row ms of a decode step of ``batch`` rows and of one row, and their ratio."""
    if batch == 1 or not hasattr(probes, "step_seconds"):
        return None
    one = probes.step_seconds(model, request, 1)
    many = probes.step_seconds(model, request, batch) / batch
    return {
        "rows": batch,
        "ms_per_row": round(1e3 * many, 3),
        "ms_one_row": round(1e3 * one, 3),
        "ratio": round(many / one, 3),
    }


def command(
    case: str,
    model_dir: Path,
    *,
    engine: str | None = None,
    dtype: str,
    cores: int,
    clip: Path | None = None,
    compile: bool = False,
    batch: int = 1,
) -> list[str]:
    """The command line that runs ``run(...)`` in a fresh Python process."""
    cmd = [sys.executable, "-m", "ffai.bench.agreement", case, "--model", str(model_dir), "--dtype", dtype]
    cmd += ["--cores", str(cores), "--batch", str(batch)] + (["--compile"] if compile else [])
    if engine is not None:
        cmd += ["--engine", engine]
    if clip is not None:
        cmd += ["--clip", str(clip)]
    return cmd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ffai.bench.agreement", description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=cases.CASES)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--engine", help="the engine (default: the default engine)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--cores", type=int, help="cores the timed arms use (default: this process's)")
    parser.add_argument("--clip", type=Path)
    parser.add_argument("--compile", action="store_true", help="the dtype with its compiled parts")
    parser.add_argument("--batch", type=int, default=1, help="also time a decode step of this many rows")
    args = parser.parse_args(argv)
    return print_result(
        lambda: run(
            args.case,
            args.model,
            engine=args.engine,
            dtype=args.dtype,
            cores=args.cores,
            clip=args.clip,
            compile=args.compile,
            batch=args.batch,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
