"""What streaming an answer costs per token: the engine's decode step with and without the
incremental decoding of each token to text, and a whole still through the caption pipeline
(inline, and in a worker process) with and without ``stream_answers``.

    python scripts/bench_streaming.py --tokens 200 --repeats 5

Forced tokens (``force_new_tokens``), the tiny random-weight checkpoint by default: its decode
step is about a millisecond, so any cost per token shows; on the real shapes a step is 30-60 ms.
Arms alternate within one run (ABAB...), medians reported; compare arms only within a run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image

from ffai import media
from ffai.bench import checkpoints
from ffai.engines import registry
from ffai.engines.contract import DecodingOptions, Request, RuntimeOptions
from ffai.run.captioner import Captioner, Progress
from ffai.run.inline import InlineEngine
from ffai.run.options import CaptionOptions


def step_ms(model, encoded, stream) -> float:
    """Median ms between consecutive tokens of one generation, ``stream`` decoding each."""
    stamps: list[float] = []

    def on_token(token_id: int) -> None:
        if stream is not None:
            stream.step(token_id)
        stamps.append(time.perf_counter())

    model["text"].generate_ids(encoded, on_token)
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:])) * 1000


def engine_arms(model_dir: Path, tokens: int, repeats: int) -> dict[str, float]:
    from ffai.kit.host import set_threads

    set_threads(2)  # as the pipeline sets it on this 2-core machine
    model = InlineEngine(registry.get_engine("smolvlm"), model_dir, RuntimeOptions())
    options = DecodingOptions(max_new_tokens=tokens, force_new_tokens=True)
    frame = Image.new("RGB", (64, 48), (200, 40, 30))
    encoded = model.through(Request.frames([frame], [0.0], options), "vision")
    step_ms(model, encoded, None)  # warm-up
    plain, streamed = [], []
    for _ in range(repeats):
        plain.append(step_ms(model, encoded, None))
        streamed.append(step_ms(model, encoded, model["text"].prompts.text_stream()))
    return {"step_ms": statistics.median(plain), "step_ms_streaming": statistics.median(streamed)}


def pipeline_arms(model_dir: Path, still: Path, tokens: int, repeats: int, placement: str) -> dict[str, float]:
    info = media.Decoder().probe(still)
    out = {}
    seconds: dict[bool, list[float]] = {False: [], True: []}
    captioners = {}
    for stream in (False, True):
        options = CaptionOptions(
            model=str(model_dir),
            decoding=DecodingOptions(max_new_tokens=tokens, force_new_tokens=True),
            placement=placement,
            stream_answers=stream,
        )
        captioners[stream] = Captioner(options, video=False, cores=2).start()
    try:
        for captioner in captioners.values():  # warm-up
            list(captioner.captions(info, Progress(on_text=lambda i, p: None)))
        for _ in range(repeats):
            for stream, captioner in captioners.items():
                pieces: list[str] = []
                began = time.perf_counter()
                list(captioner.captions(info, Progress(on_text=lambda _, piece, out=pieces: out.append(piece))))
                seconds[stream].append(time.perf_counter() - began)
                assert bool(pieces) == stream
    finally:
        for captioner in captioners.values():
            captioner.close()
    for stream, name in ((False, "still_ms"), (True, "still_ms_streaming")):
        out[f"{placement}_{name}"] = statistics.median(seconds[stream]) * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint (default: the tiny random one)")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model_dir = args.model or checkpoints.checkpoint("tiny")
    with tempfile.TemporaryDirectory() as folder:
        still = Path(folder) / "still.png"
        Image.new("RGB", (64, 48), (200, 40, 30)).save(still)
        figures = engine_arms(model_dir, args.tokens, args.repeats)
        for placement in ("inline", "workers"):
            figures |= pipeline_arms(model_dir, still, args.tokens, args.repeats, placement)
    for name, value in figures.items():
        print(f"{name:32} {value:9.3f}")
    for prefix in ("inline_", "workers_"):
        extra = figures[f"{prefix}still_ms_streaming"] - figures[f"{prefix}still_ms"]
        print(f"{prefix}per_token_overhead_ms   {extra / args.tokens:9.4f}")


if __name__ == "__main__":
    main()
