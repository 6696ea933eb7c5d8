"""Decode ms/token of SmolVLM's text tower, eager and compiled (ffai/kit/compiled_decode.py),
every arm in one process, one step of each in turn, beside the memory floor and llama.cpp.

    python scripts/bench_compiled_decode.py [--threads 1,2] [--tokens 32] [--model DIR]
        [--arms float32,int8,int8+compile,int8+compile-int8pack,bfloat16] [--rss ARM | --profile ARM]
        [--llama-bench BIN --gguf FILE]

Each arm loads the text tower in its dtype and decodes from its own cache after a prefill of
``--prompt`` random tokens; a round times one step of every arm, so a load from other work on
the machine falls on all arms alike. The floor is the bytes a step must read (the text tower's
weights and the cache's filled prefix) at the bandwidth ``--bandwidth`` (GB/s) gives.

``+compile`` is the shipped step (``CompiledDecode``: the AOTInductor package, the LM head
inside, its int8 linears by the kernel ``kernels.compiled_row_kernel`` picks for the thread
count and the CPU; ``bfloat16+compile`` bfloat16's). Levers measured beside it: ``-sums`` (every
int8 linear as float32 sums of its int8 weight times the float32 row, in inductor's loops: no
packed copy, no 8-bit row; what two threads or more ship without AMX), ``-fbgemm`` (fbgemm's
int8 kernel on a row quantised to 8 bits: what one thread and AMX ship), ``-eagerhead`` (the LM
head eager's), ``-mlp`` (fbgemm for the MLPs only, ``torch._weight_int8pack_mm`` for the rest),
``-int8pack`` (``torch._weight_int8pack_mm`` with a bfloat16 row for every linear, the LM head
eager's, unless ``-head`` too), ``-wide`` (the wide bfloat16 layers int8 too), e.g.
``int8+compile-int8pack-head``. Each is compiled into a temporary FFAI_HOME unless FFAI_HOME is
set, before the timed steps, then loaded again as a new process would: both times are printed.
Compiled arms load a model of their own (a compiled bfloat16 step leaves its layers' weights
plain). Tokens of each compiled arm are compared with its eager arm's and with float32's
(greedy, same prompt).
``--rss ARM`` instead runs that one arm alone for ``--tokens`` steps and prints the peak RSS
after the load and after decoding; a package not yet in FFAI_HOME is compiled in that process
first, and its peak is the compile's: set FFAI_HOME and run it twice for a warm load's;
``--profile ARM`` the same with torch's profiler, its table of ops by time. The package's own
kernels do not show there (only the ops around the step and the allocations), so profile the
eager arm: the package calls its kernels (fbgemm's for the int8 rows aside), less the Python
between them.
``--llama-bench`` (scripts/build_llama_cpp.sh) times llama.cpp's token generation on ``--gguf``
(scripts/build_llama_cpp.py: Q8_0 at the same shapes) right after the arms, at the same thread
count and cache depth, its ms/token printed in the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from ffai.kit import compiled_decode

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
    parser.add_argument("--arms", default="float32,int8,int8+compile,bfloat16")
    parser.add_argument("--rss", help="one arm alone: its peak RSS after the load and after decoding")
    parser.add_argument("--profile", help="one arm alone: torch's profiler table of its ops over the steps")
    parser.add_argument("--bandwidth", type=float, default=26.0, help="GB/s for the floor")
    parser.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (scripts/build_llama_cpp.sh)")
    parser.add_argument("--gguf", help="the Q8_0 model for --llama-bench (scripts/build_llama_cpp.py)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one thread count in this process
    args = parser.parse_args()
    if args.one is None:
        if "FFAI_HOME" not in os.environ:  # a cold compile, not the user's cache
            os.environ["FFAI_HOME"] = tempfile.mkdtemp(prefix="ffai-compiled-")
        for threads in args.threads.split(","):
            env = dict(os.environ, OMP_NUM_THREADS=threads)
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", threads], env=env, check=True)
        return 0
    return run(args, int(args.one))


def run(args, threads: int) -> int:
    from ffai.bench import checkpoints
    from ffai.kit.loading import weight_files

    torch.set_num_threads(threads)
    path = Path(args.model) if args.model else checkpoints.checkpoint("real")
    if args.rss or args.profile:
        return alone(args, path, args.rss or args.profile)
    arms = args.arms.split(",")
    models, caches, tokens, steps, loaded = {}, {}, {}, {}, {}
    prompt, n = args.prompt, args.tokens
    ids = torch.randint(0, 49152, (1, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for arm in arms:
            # Compiled arms share their dtype's model, eager arms theirs: a compiled step holds
            # the bfloat16 weights plain, which eager's one-row products read slower.
            dtype, key = arm.split("+")[0], (arm.split("+")[0], "+compile" in arm)
            if key not in loaded:
                loaded[key] = load(path, dtype)
            models[arm] = loaded[key]
            caches[arm], tokens[arm] = start(models[arm], ids, prompt + n + 8)
        for arm in arms:
            if "+compile" in arm:  # compiled here, before the timed steps, then loaded as a new process would
                dtype, variant = arm.split("+")[0], arm.split("+")[1].removeprefix("compile")
                parts = variant.split("-")  # compile[-fbgemm|-sums|-int8pack|-mlp|-wide][-head|-eagerhead]
                kernel = "int8pack" if "int8pack" in parts else "fbgemm-mlp" if "mlp" in parts else None
                kernel = "fbgemm-wide" if "wide" in parts else "sums" if "sums" in parts else kernel
                kernel = "fbgemm" if "fbgemm" in parts else kernel  # None: the thread count's, as ffai's
                whole = kernel is None or kernel in compiled_decode.WHOLE_STEP_KERNELS
                head = "head" in parts or (whole and "eagerhead" not in parts)
                folder = compiled_decode.cache_dir(weight_files(path), dtype)
                folder = folder.with_name(folder.name + variant)
                begin = time.perf_counter()
                compiled_decode.CompiledDecode(models[arm].text, folder, dtype, head, kernel).prepare()
                compile_s = time.perf_counter() - begin
                steps[arm] = compiled_decode.CompiledDecode(models[arm].text, folder, dtype, head, kernel)
                begin = time.perf_counter()
                steps[arm].prepare()
                print(f"{arm}: compiled in {compile_s:.1f} s, a new load took {time.perf_counter() - begin:.2f} s")
        steps_logits: dict[str, list] = {}
        walls: dict[str, list] = {arm: [] for arm in arms}
        for i in range(n):
            for arm in arms:
                models[arm].text.compiled_decode = steps.get(arm)  # arms of one dtype share its model
                begin = time.perf_counter()
                logits = step(models[arm], tokens[arm], prompt + i, caches[arm])
                if i:  # the first step of each arm warms it
                    walls[arm].append(time.perf_counter() - begin)
                steps_logits.setdefault(arm, []).append(logits.float().clone())
    print(f"checkpoint {path.name}, torch {torch.__version__}, {threads} thread(s), prompt {prompt}, {n} steps")
    print(f"{'arm':<20}{'ms/token':>10}{'floor ms':>10}  tokens")
    for arm in arms:
        dtype = arm.split("+")[0]
        floor = 1e3 * weight_bytes(models[arm].text, dtype) / (args.bandwidth * 1e9)
        same = ""
        if "+" in arm and dtype in arms:
            same = _agreement(tokens, steps_logits, arm, dtype, n, "eager")
        if arm != "float32" and "float32" in arms:
            same += _agreement(tokens, steps_logits, arm, "float32", n, "float32")
        print(f"{arm:<20}{1e3 * statistics.median(walls[arm]):>10.2f}{floor:>10.2f}  {same}")
    if args.llama_bench:
        print(f"{'llama.cpp Q8_0':<20}{_llama_cpp_ms(args, threads):>10.2f}  llama-bench tg{n} at depth {prompt}")
    return 0


def load(path: Path, dtype: str):
    from ffai.engines.smolvlm.stages import STAGES

    return STAGES.load_model(path, STAGES.precision(dtype, "cpu"), parts=("text",))


def start(model, ids: torch.Tensor, length: int) -> tuple:
    """A cache of ``length`` positions filled by the prompt's prefill, and the first token."""
    from ffai.kit.generate import Prompt, prefill

    cache = model.text.new_cache(1, length)
    logits = prefill(model.text, Prompt(model.text.embed(ids)), cache)
    return cache, [int(logits.argmax(-1))]


def step(model, tokens: list[int], pos: int, cache) -> torch.Tensor:
    """One greedy step at ``pos``: its token appended to ``tokens``, its logits returned."""
    from ffai.kit.generate import decode_one_token

    logits = decode_one_token(model.text, torch.tensor([tokens[-1]]), pos, pos, cache)
    tokens.append(int(logits.argmax(-1)))
    return logits


def alone(args, path: Path, arm: str) -> int:
    """``arm`` alone: peak RSS after the load (and the compiled step's package load) and after
    decoding, or (``--profile``) the ops that took the steps' time."""
    from ffai.kit.loading import weight_files

    dtype = arm.split("+")[0]
    ids = torch.randint(0, 49152, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model = load(path, dtype)
        cache, tokens = start(model, ids, args.prompt + args.tokens + 8)
        if "+compile" in arm:
            compiled_decode.attach(model.text, weight_files(path), dtype)
        step(model, tokens, args.prompt, cache)  # the package's load, where compiled
        loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with (
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            if args.profile
            else nullcontext() as prof
        ):
            for i in range(1, args.tokens):
                step(model, tokens, args.prompt + i, cache)
    if args.profile:
        print(f"{arm}, {args.tokens - 1} steps, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{arm}: peak RSS {loaded:.0f} MiB after the load and first step, {peak:.0f} MiB after {args.tokens} steps")
    return 0


def _llama_cpp_ms(args, threads: int) -> float:
    """llama.cpp's ms/token generating ``--tokens`` after a cache of ``--prompt`` (llama-bench's mean)."""
    cmd = [args.llama_bench, "-m", args.gguf, "-t", str(threads), "-p", "0", "-n", str(args.tokens)]
    cmd += ["-d", str(args.prompt), "-r", "3", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    (result,) = json.loads(out.stdout)
    return 1e3 / result["avg_ts"]


def _agreement(tokens: dict, logits: dict, arm: str, other: str, n: int, name: str) -> str:
    """Tokens of ``arm`` against ``other``'s, and their logits' agreement over the steps both were
    fed the same tokens (before the first difference)."""
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
