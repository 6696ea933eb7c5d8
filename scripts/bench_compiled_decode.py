"""Decode ms/token of SmolVLM's text tower, eager and compiled (engines/smolvlm/compiled_decode.py),
every arm in one process, one step of each in turn, beside the memory floor.

    python scripts/bench_compiled_decode.py [--threads 1,2] [--tokens 32] [--model DIR]
        [--arms float32,int8,int8+compile,bfloat16,bfloat16+compile]

Each arm loads the text tower in its dtype and decodes from its own cache after a prefill of
``--prompt`` random tokens; a round times one step of every arm, so a load from other work on
the machine falls on all arms alike. The floor is the bytes a step must read (the text tower's
weights and the cache's filled prefix) at the bandwidth ``--bandwidth`` (GB/s) gives. Compiled
arms compile into a temporary FFAI_HOME unless FFAI_HOME is set; the first step of a compiled arm
(compile or cache load) is timed separately and printed. Tokens of each compiled arm are compared
with its eager arm's (greedy, same prompt).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "int8": 1}


def weight_bytes(text, dtype: str) -> int:
    """The bytes of the linear weights a decode step reads (norms and one embedding row are noise)."""
    linears = [m for m in text.modules() if hasattr(m, "in_features") and hasattr(m, "out_features")]
    return sum(m.in_features * m.out_features for m in linears) * WEIGHT_BYTES[dtype]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=120)
    parser.add_argument("--model", help="checkpoint folder (default: the real-shape random test checkpoint)")
    parser.add_argument("--arms", default="float32,int8,int8+compile,bfloat16,bfloat16+compile")
    parser.add_argument("--bandwidth", type=float, default=26.0, help="GB/s for the floor")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one thread count in this process
    args = parser.parse_args()
    if args.one is None:
        os.environ.setdefault("FFAI_HOME", tempfile.mkdtemp(prefix="ffai-compiled-"))
        for threads in args.threads.split(","):
            env = dict(os.environ, OMP_NUM_THREADS=threads)
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", threads], env=env, check=True)
        return 0
    return run(args, int(args.one))


def run(args, threads: int) -> int:
    import torch

    from ffai.bench import checkpoints
    from ffai_smolvlm import compiled_decode
    from ffai_smolvlm.generate import decode_one_token, prefill
    from ffai_smolvlm.precision import plan_precision
    from ffai_smolvlm.weights import load_model, weight_files

    torch.set_num_threads(threads)
    path = Path(args.model) if args.model else checkpoints.checkpoint("real")
    arms = args.arms.split(",")
    models, caches, tokens, first_step, loaded = {}, {}, {}, {}, {}
    prompt, n = args.prompt, args.tokens
    ids = torch.randint(0, 49152, (1, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for arm in arms:
            dtype = arm.split("+")[0]
            if dtype not in loaded:
                loaded[dtype] = load_model(path, plan_precision(dtype, "cpu"), parts=("text",))
            model = loaded[dtype]
            models[arm] = model
            cache = model.text.new_cache(1, prompt + n + 8)
            logits = prefill(model, model.text.embed_tokens(ids), cache)
            caches[arm] = cache
            tokens[arm] = [int(logits.argmax(-1))]
        steps_logits: dict[str, list] = {}
        steps = {
            arm: compiled_decode.CompiledDecode(
                models[arm].text, compiled_decode.cache_dir(weight_files(path), dtype), dtype
            )
            for arm in arms
            if arm.endswith("+compile") and (dtype := arm.split("+")[0])
        }

        def step(arm: str, i: int) -> None:
            model = models[arm]
            model.text.compiled_decode = steps.get(arm)  # arms of one dtype share its model
            pos = torch.tensor([prompt + i])
            logits = decode_one_token(model, torch.tensor([tokens[arm][-1]]), pos, caches[arm])
            tokens[arm].append(int(logits.argmax(-1)))
            steps_logits.setdefault(arm, []).append(logits.float().clone())

        for arm in arms:  # first step: compile or cache load for compiled arms
            start = time.perf_counter()
            step(arm, 0)
            first_step[arm] = time.perf_counter() - start
        walls = {arm: [] for arm in arms}
        for i in range(1, n):
            for arm in arms:
                start = time.perf_counter()
                step(arm, i)
                walls[arm].append(time.perf_counter() - start)
    print(f"checkpoint {path.name}, torch {torch.__version__}, {threads} thread(s), prompt {prompt}, {n} steps")
    print(f"{'arm':<20}{'ms/token':>10}{'floor ms':>10}{'first step s':>14}  tokens")
    for arm in arms:
        dtype = arm.split("+")[0]
        floor = 1e3 * weight_bytes(models[arm].text, dtype) / (args.bandwidth * 1e9)
        same = ""
        if arm.endswith("+compile") and dtype in arms:
            same = _agreement(tokens, steps_logits, arm, dtype, n, "eager")
        if arm != "float32" and "float32" in arms:
            same += _agreement(tokens, steps_logits, arm, "float32", n, "float32")
        print(f"{arm:<20}{1e3 * statistics.median(walls[arm]):>10.2f}{floor:>10.2f}{first_step[arm]:>14.2f}  {same}")
    return 0


def _agreement(tokens: dict, logits: dict, arm: str, other: str, n: int, name: str) -> str:
    """Tokens of ``arm`` against ``other``'s, and their logits' agreement over the steps both were
    fed the same tokens (before the first difference)."""
    import torch

    diff = _first_diff(tokens[arm], tokens[other])
    said = f"same as {name}" if diff is None else f"differ from {name} from token {diff}"
    pairs = list(zip(logits[arm], logits[other]))[: n if diff is None else diff]
    if not pairs:
        return said + "; "
    cos = min(float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min()) for a, b in pairs)
    worst = max(float((a - b).abs().max()) for a, b in pairs)
    return f"{said} (logits over {len(pairs)} steps: cosine >= {cos:.6f}, max |diff| {worst:.3g}); "


def _first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


if __name__ == "__main__":
    sys.exit(main())
