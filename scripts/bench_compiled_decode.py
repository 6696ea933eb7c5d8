"""Decode ms/token of SmolVLM's text tower, eager and compiled (engines/smolvlm/compiled_decode.py),
every arm in one process, one step of each in turn, beside the memory floor and llama.cpp.

    python scripts/bench_compiled_decode.py [--threads 1,2] [--tokens 32] [--model DIR]
        [--arms float32,int8,int8+compile,int8+frozen,int8+aoti,bfloat16,bfloat16+compile]
        [--llama-bench BIN --gguf FILE]

Each arm loads the text tower in its dtype and decodes from its own cache after a prefill of
``--prompt`` random tokens; a round times one step of every arm, so a load from other work on
the machine falls on all arms alike. The floor is the bytes a step must read (the text tower's
weights and the cache's filled prefix) at the bandwidth ``--bandwidth`` (GB/s) gives. Compiled
arms compile into a temporary FFAI_HOME unless FFAI_HOME is set; the first step of a compiled arm
(compile or cache load) is timed separately and printed. Tokens of each compiled arm are compared
with its eager arm's (greedy, same prompt).

``+frozen`` is a lever measured here, not shipped: the whole step (every layer, the norm and the
LM head) as one module whose weights are buffers, compiled with freezing and max-autotune, so
inductor's C++ GEMM templates (weight-only int8, bfloat16) may replace the eager kernels.
``+aoti`` is the same module exported and compiled by AOTInductor (default settings) into one
package with its weights, under FFAI_HOME, before the timed steps; its load time is printed.
``--llama-bench`` (scripts/build_llama_cpp.sh) times llama.cpp's token generation on ``--gguf``
(scripts/build_llama_cpp.py: Q8_0 at the same shapes) right after the arms, at the same thread
count and cache depth, its ms/token printed in the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ffai.opt_in_linears import PackedBf16Linear, QuantizedLinear, RowScaledLinear
from ffai_smolvlm import compiled_decode

WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "int8": 1}


# Inductor's settings for the frozen step: its weights become constants, which lets inductor's C++
# GEMM templates (weight-only int8 by row, bfloat16; AMX or AVX-512 micro-kernels) replace the
# eager kernels, chosen by timing each candidate at the step's own shapes.
FROZEN_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


class FrozenLinear(nn.Module):
    """One linear of the frozen step, its weight a buffer (a constant once frozen): int8 by row
    (``RowScaledLinear``'s weight and scales, or fbgemm's unpacked: the same symmetric int8) times a
    bfloat16 row, as ``RowScaledLinear`` multiplies a decode row; bfloat16 (oneDNN's packed
    weights, unpacked); else the float weight as it is."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        bias = None
        if isinstance(linear, RowScaledLinear):
            self.kind = "int8"
            self.register_buffer("weight", linear.int8_weight)
            self.register_buffer("scale", linear.scale)
            bias = linear.bias
        elif isinstance(linear, QuantizedLinear):
            self.kind = "int8"
            qweight, bias = torch.ops.quantized.linear_unpack(linear.packed)
            if bool(qweight.q_per_channel_zero_points().any()):
                raise ValueError("an int8 weight with zero points")
            self.register_buffer("weight", qweight.int_repr().contiguous())
            self.register_buffer("scale", qweight.q_per_channel_scales().float())
        elif isinstance(linear, PackedBf16Linear):
            self.kind = "bf16"
            self.register_buffer("weight", linear.dense_weight().contiguous())
            bias = linear.bias
        else:
            self.kind = "float"
            self.register_buffer("weight", linear.weight.detach())
            bias = linear.bias
        if self.kind == "int8":
            self.register_buffer("unit", torch.ones(self.weight.shape[0], dtype=torch.bfloat16))
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.kind == "int8":
            y = torch._weight_int8pack_mm(rows.to(torch.bfloat16), self.weight, self.unit).float() * self.scale
        elif self.kind == "bf16":
            y = F.linear(rows.to(torch.bfloat16), self.weight).float()
        else:
            y = F.linear(rows.to(self.weight.dtype), self.weight).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], y.shape[-1])


class _FrozenMLP(nn.Module):
    def __init__(self, mlp) -> None:
        super().__init__()
        self.gate_up, self.down_proj = FrozenLinear(mlp.gate_up), FrozenLinear(mlp.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up.forward(x).chunk(2, dim=-1)
        return self.down_proj.forward(F.silu(gate) * up)


class _FrozenAttention(nn.Module):
    def __init__(self, attn) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = attn.n_heads, attn.n_kv, attn.head_dim
        self.qkv, self.o_proj = FrozenLinear(attn.qkv), FrozenLinear(attn.o_proj)


class _FrozenLayer(nn.Module):
    """A decoder layer with :class:`FrozenLinear` linears, for :func:`layer_step`."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
        self.self_attn, self.mlp = _FrozenAttention(layer.self_attn), _FrozenMLP(layer.mlp)


class FrozenStep(nn.Module):
    """The whole decode step, every layer, the norm and the LM head, as one module whose weights
    are buffers: compiled with :data:`FROZEN_OPTIONS` it is one program. Its int8 weights are the
    model's own tensors; the bfloat16 ones are unpacked copies."""

    def __init__(self, text: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_FrozenLayer(layer) for layer in text.layers)
        self.norm, self.lm_head = text.norm, FrozenLinear(text.lm_head)

    def forward(self, x, pos, cos, sin, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
        for layer, k, v in zip(self.layers, ks, vs):
            x = compiled_decode.layer_step(layer, x, pos, cos, sin, k, v)
        return self.lm_head.forward(self.norm.forward(x))[:, -1]


class FrozenDecode:
    """The decode step as one frozen program (:class:`FrozenStep`), compiled in this process by
    its first call (inductor does not cache a frozen graph's code on disk); the same contract as
    ``compiled_decode.CompiledDecode``'s call."""

    def __init__(self, text: nn.Module) -> None:
        self.text = text
        self.step = None

    def __call__(self, x: torch.Tensor, pos: torch.Tensor, cache: object) -> torch.Tensor | None:
        if x.shape[0] != 1:
            return None
        if self.step is None:
            module = FrozenStep(self.text).eval()
            self.step = torch.compile(module, fullgraph=True, dynamic=False, options=FROZEN_OPTIONS)
        first = int(pos[0])
        cos, sin = self.text._rope_rows(first, first + 1, x)
        if 2 not in getattr(cache.k[0], "_dynamo_dynamic_indices", ()):  # one graph for every cache length
            for t in (*cache.k, *cache.v):
                torch._dynamo.mark_dynamic(t, 2)
        return self.step(x, pos, cos, sin, list(cache.k), list(cache.v))


class AotiDecode:
    """:class:`FrozenStep` exported (the caches' length dynamic, written in place) and compiled
    ahead of time by AOTInductor into one package holding its weights, then loaded: the road to a
    warm start without tracing. Compiled at construction; the same call as ``FrozenDecode``."""

    def __init__(self, text: nn.Module, x, pos, cache, package: Path) -> None:
        self.text = text
        step = FrozenStep(text).eval()
        cos, sin = text._rope_rows(int(pos[0]), int(pos[0]) + 1, x)
        length = torch.export.Dim("length", min=2, max=1 << 16)
        ks, vs = list(cache.k), list(cache.v)
        dynamic = {"x": None, "pos": None, "cos": None, "sin": None}
        dynamic |= {"ks": [{2: length}] * len(ks), "vs": [{2: length}] * len(vs)}
        with torch.no_grad():
            program = torch.export.export(step, (x, pos, cos, sin, ks, vs), dynamic_shapes=dynamic)
        torch._inductor.aoti_compile_and_package(program, package_path=str(package))
        start = time.perf_counter()
        self.runner = torch._inductor.aoti_load_package(str(package))
        self.load_s = time.perf_counter() - start

    def __call__(self, x, pos, cache) -> torch.Tensor | None:
        first = int(pos[0])
        cos, sin = self.text._rope_rows(first, first + 1, x)
        return self.runner(x, pos, cos, sin, list(cache.k), list(cache.v))


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
        steps |= {arm: FrozenDecode(models[arm].text) for arm in arms if arm.endswith("+frozen")}
        for arm in arms:
            if arm.endswith("+aoti"):  # compiled here, before the timed steps; the load time printed
                start = time.perf_counter()
                x = models[arm].text.embed_tokens(torch.tensor([[tokens[arm][-1]]]))
                package = Path(os.environ["FFAI_HOME"]) / f"decode-{arm}.pt2"
                steps[arm] = AotiDecode(models[arm].text, x, torch.tensor([prompt]), caches[arm], package)
                print(f"{arm}: exported and compiled in {time.perf_counter() - start:.1f} s, package", end=" ")
                print(f"{package.stat().st_size / 1e6:.1f} MB, loaded in {steps[arm].load_s:.2f} s", flush=True)

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
        if "+" in arm and dtype in arms:
            same = _agreement(tokens, steps_logits, arm, dtype, n, "eager")
        if arm != "float32" and "float32" in arms:
            same += _agreement(tokens, steps_logits, arm, "float32", n, "float32")
        print(f"{arm:<20}{1e3 * statistics.median(walls[arm]):>10.2f}{floor:>10.2f}{first_step[arm]:>14.2f}  {same}")
    if args.llama_bench:
        print(
            f"{'llama.cpp Q8_0':<20}{_llama_cpp_ms(args, threads):>10.2f}{'':>10}{'':>14}  llama-bench tg{n} at depth {prompt}"
        )
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
