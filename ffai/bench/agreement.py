"""The bench's untimed precision run: ffai in ``--dtype`` against ffai in float32, one case per process.

    python -m ffai.bench.agreement CASE --model DIR --dtype D [--cores N] [--clip MP4]

prints one JSON object on stdout. The timed arms stay as they are (one model, one dtype, their
own peak RSS); this process loads ffai's engine twice, in ``--dtype`` and in float32 (the
float32 engine is bit-identical to the transformers reference, which the float32 bench's
correctness gate and the oracle tests keep), and for each item of the case:

- the vision tower + connector output of every tile in both dtypes, and their cosine similarity;
- the prefill logits (the next-token distribution after the prompt) in both, and their cosine;
- the case's 32 forced greedy tokens in both (the gates compare them position by position);
- in ``--dtype``: the time to the first token (embedding + prefill) and the decode time per
  token, from the timestamps the engine's per-token callback gives as each token comes (after
  one untimed warm-up on the first item, as the timed arms warm up). Reported: the median over
  items of the first, the median over all decode steps of the second (on shared cores a step
  that lost its core to another process is an outlier, not the decode rate).

With ``--dtype float32`` only one model is loaded and only the timings are measured.

The same process measures the machine's memory bandwidth (a plain ``torch.sum`` over a 500 MB
float32 tensor, best of a few) and the decode floor: the bytes of the text tower and the LM
head at the dtype's width, read once per token at that bandwidth. As the issue counts it, the
text tower includes its embedding table, of which a decode step reads one row only, so the
floor is the issue's (~163 MB for int8 on SmolVLM-256M), not a tighter one.

Threads: as many as ffai's text stage gets on these cores (``ffai.captioning.pipeline_config``),
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
from ffai.engine import DTYPES, RuntimeOptions

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


def text_weights(model_dir: Path) -> int:
    """How many weights the text tower (embedding table, layers, final norm) and the LM head hold,
    counted from config.json (an int8 model's packed weights are no ``nn.Parameter`` to count)."""
    from ffai_smolvlm.config import ModelConfig

    cfg = ModelConfig.from_dir(model_dir)
    t = cfg.text
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    attention = t.hidden_size * (q + 2 * kv) + q * t.hidden_size
    if t.attention_bias:
        attention += q + 2 * kv + t.hidden_size
    mlp = 3 * t.hidden_size * t.intermediate_size
    if t.mlp_bias:
        mlp += 2 * t.intermediate_size + t.hidden_size
    layer = attention + mlp + 2 * t.hidden_size  # two RMSNorm weights
    embed = t.vocab_size * t.hidden_size
    head = 0 if cfg.tie_word_embeddings else t.vocab_size * t.hidden_size
    return embed + t.num_hidden_layers * layer + t.hidden_size + head


def weight_bytes(dtype: str) -> int:
    """Bytes per weight in ``dtype`` (int8's per-row scales, one float per row, left out)."""
    import torch

    return getattr(torch, dtype).itemsize


def decode_floor(model_dir: Path, dtype: str, bytes_per_s: float) -> dict:
    """The decode floor: the text tower and LM head at ``dtype``'s width, read once at ``bytes_per_s``."""
    n_bytes = text_weights(model_dir) * weight_bytes(dtype)
    ms = round(1e3 * n_bytes / bytes_per_s, 3)
    return {"bytes": n_bytes, "bandwidth_gb_s": round(bytes_per_s / 1e9, 2), "ms": ms}


def prefill_logits(model, encoded) -> "torch.Tensor":
    """(vocab,) the logits the prompt (image embeddings merged in) gives for the first new token."""
    import torch

    from ffai_smolvlm.generate import prefill

    net = model["text"].net
    ids = torch.tensor([encoded.input_ids], device=net.device)  # (1, T)
    with torch.inference_mode():
        x = net.embed(ids, encoded.image_embeds)  # (1, T, D)
        return prefill(net, x, net.text.reserve_cache(1, ids.shape[1]))[0]


def timed_tokens(model, encoded) -> tuple[list[int], float, list[float]]:
    """The tokens, the seconds to the first one, and the seconds between each token and the next.

    The engine's own ``generate`` with a callback that only takes the time: the text stage's
    ``on_token`` decodes each token to text, and the tokenizer's thread pool then spins on the
    cores the decode step needs (on 2 cores a 1 ms step of the tiny model took 64 ms)."""
    import torch

    from ffai_smolvlm.generate import generate

    stamps: list[float] = []
    decoder = model["text"]
    ids = torch.tensor([encoded.input_ids], device=decoder.net.device)  # (1, T)
    start = time.perf_counter()
    with torch.inference_mode():
        tokens = generate(
            decoder.net,
            ids,
            encoded.image_embeds,
            encoded.options,
            decoder.stop_ids,
            lambda _: stamps.append(time.perf_counter()),
        )
    return tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]


def text_threads(model_dir: Path, runtime: RuntimeOptions, cores: int) -> int:
    """Torch threads in the process that holds ffai's last (decoding) stage on ``cores`` cores."""
    from ffai import registry
    from ffai.captioning import pipeline_config

    config = pipeline_config(registry.get_engine("smolvlm").stages(), model_dir, runtime, cores)
    threads = {p.name: p.threads for p in config.processes}
    return threads[config.stages[-1].process]


def run(case: str, model_dir: Path, *, dtype: str, cores: int | None = None, clip: Path | None = None) -> dict:
    """The case's items in ``dtype`` (timed per token) and, unless float32, in float32 too."""
    from ffai import registry
    from ffai.captioning import available_cores
    from ffai.inline import InlineEngine
    from ffai.pipeline.worker import set_threads

    runtime = RuntimeOptions(dtype=dtype, device="cpu")
    threads = text_threads(model_dir, runtime, cores or available_cores())
    set_threads(threads)
    bytes_per_s = bandwidth()
    engine = registry.get_engine("smolvlm")
    ours = InlineEngine(engine, model_dir, runtime)
    exact = (
        None if dtype == "float32" else InlineEngine(engine, model_dir, RuntimeOptions(dtype="float32", device="cpu"))
    )
    options = cases.decoding()
    items = list(cases.clip_items(clip)) if case == "clip" else cases.items(case)
    tokens: dict[str, dict[str, list[int]]] = {"ours": {}, "float32": {}}
    tiles: dict[str, list[float]] = {}
    logits: dict[str, float] = {}
    first_s, steps_s = [], []
    # One untimed pass over the first item, as the timed arms warm up: a fresh model's first
    # prefill and decode steps pay for one-off kernel and buffer set-up.
    timed_tokens(ours, ours.through(items[0].request(options), "vision"))
    for item in items:
        prepared = ours["preprocess"](item.request(options))
        encoded = ours["vision"](prepared)
        ids, first, steps = timed_tokens(ours, encoded)
        tokens["ours"][item.id] = ids
        first_s.append(first)
        steps_s += steps
        if exact is None:
            continue
        reference = exact["vision"](prepared)
        # Unrounded: the gate compares them with its bound.
        tiles[item.id] = tile_cosines(encoded.image_embeds, reference.image_embeds)
        logits[item.id] = cosine(prefill_logits(ours, encoded), prefill_logits(exact, reference))
        tokens["float32"][item.id] = exact["text"].generate_ids(reference)
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
        "floor": decode_floor(model_dir, dtype, bytes_per_s),
    }


def command(case: str, model_dir: Path, *, dtype: str, cores: int, clip: Path | None = None) -> list[str]:
    """The command line that runs ``run(...)`` in a fresh Python process."""
    cmd = [sys.executable, "-m", "ffai.bench.agreement", case, "--model", str(model_dir), "--dtype", dtype]
    cmd += ["--cores", str(cores)]
    if clip is not None:
        cmd += ["--clip", str(clip)]
    return cmd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ffai.bench.agreement", description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=cases.CASES)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--cores", type=int, help="cores the timed arms use (default: this process's)")
    parser.add_argument("--clip", type=Path)
    args = parser.parse_args(argv)
    return print_result(lambda: run(args.case, args.model, dtype=args.dtype, cores=args.cores, clip=args.clip))


if __name__ == "__main__":
    sys.exit(main())
