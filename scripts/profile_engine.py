"""Stage-by-stage timings of the SmolVLM engine against transformers, side by side in one run.

    python scripts/profile_engine.py [--threads 2] [--cases frame,window,still] [--repeat 2] [--tokens 32]
                                     [--reference-attention sdpa|eager]
    python scripts/profile_engine.py --decode-ops int8|bfloat16|float32 [--threads 2] [--tokens 32]

Both run on the real-shape random checkpoint (``ffai.bench.checkpoints.checkpoint("real")``),
fp32, greedy, ``--tokens`` forced new tokens, and must give the same tokens. Each repeat runs
ours then the reference on the same images; the table keeps each stage's minimum over the
repeats (the machine is shared, so the minimum is the least noisy estimate).

Stages: preprocess (image → tiles + prompt ids), vision (tower + connector), prefill (from the
image embeddings to the first decode step, including the merge and the first token's logits),
decode (per token, everything generate does per step), total (sum of the above).

``--reference-attention eager`` loads the reference with transformers' eager attention instead
of its default (SDPA): the vision tower's attention then runs as matmul + softmax + matmul.

``--decode-ops DTYPE`` profiles ffai's decode step alone in that dtype (no reference): the
text tower after a 200-token prefill, ``--tokens`` steps under torch's profiler, its ops by self
time with their counts per step, and the wall time per step beside their sum (the rest is
Python and dispatch between the ops).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

STAGES = ("preprocess", "vision", "prefill", "decode")
PROFILED = ("frame", "window", "still")  # the bench's one-request cases
STILL_QUESTION = "Describe this image."
FRAMES_QUESTION = "Describe what happens in these frames."


@dataclass
class Timing:
    """Seconds per stage (decode: per token), minimum over repeats."""

    stages: dict = field(default_factory=lambda: {s: float("inf") for s in STAGES})
    total: float = float("inf")

    def add(self, run: dict, n_tokens: int) -> None:
        for stage in STAGES:
            self.stages[stage] = min(self.stages[stage], run[stage])
        total = sum(run[s] for s in STAGES[:-1]) + run["decode"] * n_tokens
        self.total = min(self.total, total)


class StepClock:
    """Start times of a module's forward calls, plus optional end time of another module's."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.vision_start = self.vision_end = None

    def attach(self, text, vision=None, vision_last=None) -> list:
        handles = [text.register_forward_pre_hook(lambda *_: self.starts.append(time.perf_counter()))]
        if vision is not None:
            handles.append(
                vision.register_forward_pre_hook(lambda *_: setattr(self, "vision_start", time.perf_counter()))
            )
            handles.append(
                vision_last.register_forward_hook(lambda *_: setattr(self, "vision_end", time.perf_counter()))
            )
        return handles


def case_images(name: str):
    """The bench's images for ``name`` (ffai.bench.cases), so the profile and the bench time the same inputs."""
    from ffai.bench import cases

    if name not in PROFILED:
        raise SystemExit(f"unknown case {name!r} ({', '.join(PROFILED)})")
    item = cases.items(name)[0]
    return item


def run_ours(model, item, n: int) -> tuple[dict, list[int], int]:
    from ffai.engines.contract import DecodingOptions

    options = DecodingOptions(max_new_tokens=n, force_new_tokens=True)
    t0 = time.perf_counter()
    prepared = model["preprocess"](item.request(options))
    t1 = time.perf_counter()
    encoded = model["vision"](prepared)
    t2 = time.perf_counter()
    clock = StepClock()
    handles = clock.attach(model["text"].net.text)
    try:
        tokens = model["text"].generate_ids(encoded)
    finally:
        for h in handles:
            h.remove()
    t3 = time.perf_counter()
    stages = {"preprocess": t1 - t0, "vision": t2 - t1}
    stages.update(_text_stages(clock.starts, t2, t3, n))
    return stages, tokens, encoded.visual.shape[0]


def run_reference(ref, processor, images, split: bool, n: int) -> tuple[dict, list[int]]:
    import torch

    question = STILL_QUESTION if split or len(images) == 1 else FRAMES_QUESTION
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
    t0 = time.perf_counter()
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(text=text, images=images, return_tensors="pt", do_image_splitting=split)
    t1 = time.perf_counter()
    clock = StepClock()
    handles = clock.attach(ref.model.text_model, ref.model.vision_model, ref.model.connector)
    try:
        with torch.inference_mode():
            out = ref.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    finally:
        for h in handles:
            h.remove()
    t2 = time.perf_counter()
    stages = {"preprocess": t1 - t0, "vision": clock.vision_end - clock.vision_start}
    stages.update(_text_stages(clock.starts, clock.vision_end, t2, n))
    return stages, out[0, inputs["input_ids"].shape[1] :].tolist()


def _text_stages(starts: list[float], prefill_start: float, end: float, n: int) -> dict:
    """Prefill runs until the second text forward starts; the n-1 forwards after it are decode."""
    if n == 1 or len(starts) < 2:
        return {"prefill": end - prefill_start, "decode": 0.0}
    return {"prefill": starts[1] - prefill_start, "decode": (end - starts[1]) / (n - 1)}


def print_table(name: str, tiles: int, ours: Timing, ref: Timing, n: int) -> None:
    print(f"\n{name}: {tiles} tile(s), {n} forced tokens")
    print(f"{'stage':<12}{'ffai':>12}{'reference':>12}{'speed-up':>10}")
    for stage in STAGES:
        unit = "ms/token" if stage == "decode" else "ms"
        a, b = ours.stages[stage] * 1e3, ref.stages[stage] * 1e3
        print(f"{stage:<12}{a:>12.1f}{b:>12.1f}{b / a if a else float('nan'):>9.2f}x  {unit}")
    print(f"{'total':<12}{ours.total:>11.2f}s{ref.total:>11.2f}s{ref.total / ours.total:>9.2f}x")


def profile_decode(path: Path, dtype: str, threads: int, n: int) -> None:
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    from ffai.engines.smolvlm.stages import STAGES
    from ffai.kit.generate import Prompt, decode_one_token, prefill

    torch.set_num_threads(threads)
    text = STAGES.load_model(path, STAGES.precision(dtype, "cpu"), parts=("text",)).text
    prompt = 200
    with torch.inference_mode():
        x = text.embed(torch.randint(0, text.cfg.vocab_size, (1, prompt)))
        cache = text.reserve_cache(1, prompt + 2 * n + 4)
        token = prefill(text, Prompt(x), cache).argmax(-1)
        for i in range(4):  # one-off kernel and buffer set-up
            decode_one_token(text, token, prompt + i, prompt + i, cache)
        walls = []
        for i in range(4, 4 + n):
            start = time.perf_counter()
            decode_one_token(text, token, prompt + i, prompt + i, cache)
            walls.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(4 + n, 4 + 2 * n):
                decode_one_token(text, token, prompt + i, prompt + i, cache)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    print(f"decode step, {dtype}, {threads} thread(s), {n} steps after a {prompt}-token prefill")
    print(f"{'op':<52}{'calls/step':>11}{'self ms/step':>14}")
    for e in ops[:20]:
        print(f"{e.key[:51]:<52}{e.count / n:>11.0f}{e.self_cpu_time_total / 1e3 / n:>14.3f}")
    total = sum(e.self_cpu_time_total for e in ops) / 1e3 / n
    print(f"{'all ops':<52}{sum(e.count for e in ops) / n:>11.0f}{total:>14.3f}")
    print(f"wall ms/step (median, unprofiled): {1e3 * statistics.median(walls):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", default="frame,window,still")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--model", help="checkpoint folder (default: the real-shape random test checkpoint)")
    parser.add_argument(
        "--reference-attention",
        choices=("sdpa", "eager"),
        help="transformers' attention implementation (default: its own choice)",
    )
    parser.add_argument("--decode-ops", choices=("float32", "bfloat16", "int8"), help="profile ffai's decode step")
    args = parser.parse_args()

    import torch

    from ffai.bench import checkpoints
    from ffai.engines.contract import RuntimeOptions
    from ffai.engines.smolvlm.bench.checkpoints import WRITER
    from ffai.run.inline import InlineEngine

    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model else checkpoints.checkpoint("real")
    if args.decode_ops:
        profile_decode(path, args.decode_ops, args.threads, args.tokens)
        return 0
    model = InlineEngine.load("smolvlm", path, RuntimeOptions(threads=args.threads, device="cpu"))
    ref = WRITER.reference_model(path, attention=args.reference_attention)
    processor = WRITER.reference_processor(path)
    print(
        f"checkpoint {path.name}, torch {torch.__version__}, {args.threads} thread(s), "
        f"reference attention: {ref.config._attn_implementation}"
    )
    ok = True
    for name in args.cases.split(","):
        item = case_images(name)
        images, split = list(item.images), item.still
        ours, theirs = Timing(), Timing()
        for _ in range(args.repeat):
            torch.set_num_threads(args.threads)
            stages, tokens, tiles = run_ours(model, item, args.tokens)
            ours.add(stages, args.tokens)
            torch.set_num_threads(args.threads)
            ref_stages, ref_tokens = run_reference(ref, processor, images, split, args.tokens)
            theirs.add(ref_stages, args.tokens)
            if tokens != ref_tokens:
                ok = False
                print(f"{name}: tokens differ from the reference", file=sys.stderr)
        print_table(name, tiles, ours, theirs, args.tokens)
    print("\ntokens identical to the reference" if ok else "\nTOKENS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
