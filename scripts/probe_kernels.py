"""Checks the kernel rules (ffai/engines/smolvlm/precision.py) against this CPU: each of torch's
candidate kernels timed on SmolVLM2-256M-Video's linear shapes, by shape class (a tile's 1024
rows, a prefill's rows, one decode row), beside the kind the int8 and bfloat16 plans choose here.

    python scripts/probe_kernels.py [--threads 1] [--repeats 20] [--prefill-rows 900]

ffai picks kernels by rules of the CPU's flags rather than by timing at run time: a rule gives
the same kernels, so the same rounding, on every machine of a kind, and timings on a shared
machine move by tens of percent from minute to minute. This script is how a rule is checked on
a new CPU kind; figures go to docs/benchmarks.md with the CPU's model and flags.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from ffai.engines.smolvlm.precision import plan_precision
from ffai.kit import host, linear_kinds
from ffai.kit.opt_in_linears import OneDnnInt8Linear, PackedBf16Linear, QuantizedLinear, RowScaledLinear, onednn_bf16

# (layer name as the plan knows it, in, out) for each shape class's rows.
VISION = (
    ("vision.layers.4.self_attn.qkv", 768, 2304),
    ("vision.layers.4.self_attn.out_proj", 768, 768),
    ("vision.layers.4.mlp.fc1", 768, 3072),
    ("vision.layers.4.mlp.fc2", 3072, 768),
)
TEXT = (
    ("text.layers.4.self_attn.qkv", 576, 960),
    ("text.layers.4.self_attn.o_proj", 576, 576),
    ("text.layers.4.mlp.gate_up", 576, 3072),
    ("text.layers.4.mlp.down_proj", 1536, 576),
)
HEAD = (("text.lm_head", 576, 49280),)


def best_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def candidates(weight: torch.Tensor, flags: frozenset[str], bf16: bool) -> dict:
    reduce_range = not flags & linear_kinds.INT8_FULL_RANGE_FLAGS
    out = {"float32": lambda x: F.linear(x, weight)}
    out[linear_kinds.INT8] = QuantizedLinear(weight, None, reduce_range=reduce_range)
    # oneDNN's int8 is exact only where its sums do not saturate (VNNI, AMX): linear_kinds.py.
    if torch.backends.mkldnn.is_available() and flags & linear_kinds.INT8_FULL_RANGE_FLAGS:
        out[linear_kinds.INT8_ONEDNN] = OneDnnInt8Linear(weight, None)
    rows_dtype = torch.bfloat16 if bf16 else torch.float32
    out[linear_kinds.INT8_BY_ROW] = RowScaledLinear(weight, None, rows_dtype=rows_dtype)
    if bf16:
        out[linear_kinds.BF16_ONEDNN] = PackedBf16Linear(weight, None)
    return out


def with_gelu(layer):
    """The vision MLP's fc1 with its tanh GELU, as the tower runs it: fused where the layer can."""
    fused = getattr(layer, "gelu_tanh", None)
    return fused or (lambda x: torch.ops.aten.gelu_(layer(x), approximate="tanh"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--prefill-rows", type=int, default=900)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = host.cpu_info()
    bf16 = onednn_bf16() and host.native_bf16(cpu.flags)
    int8_plan, bf16_plan = plan_precision("int8", "cpu"), plan_precision("bfloat16", "cpu")
    print(f"{cpu.model}; flags {' '.join(sorted(cpu.flags & set(host.RELEVANT_FLAGS)))}")
    print(f"torch {torch.__version__}, {args.threads} thread(s), ms per call (best of {args.repeats})")
    classes = (("tile", 1024, VISION), ("prefill", args.prefill_rows, TEXT), ("one row", 1, TEXT + HEAD))
    torch.manual_seed(0)
    with torch.inference_mode():
        for label, rows, shapes in classes:
            for name, k, n in shapes:
                weight = torch.randn(n, k) * k**-0.5
                x = torch.randn(rows, k)
                layers = candidates(weight, cpu.flags, bf16).items()
                if name.endswith("fc1"):  # timed with its GELU, fused where the layer can
                    layers = [(kind, with_gelu(f)) for kind, f in layers]
                times = {kind: best_ms(lambda f=f, x=x: f(x), args.repeats) for kind, f in layers}
                fastest = min(times, key=times.get)
                cells = "  ".join(f"{kind} {ms:.3f}" for kind, ms in times.items())
                picks = f"int8 plan: {int8_plan.linear(name)}, bfloat16 plan: {bf16_plan.linear(name)}"
                gelu = " +GELU" if name.endswith("fc1") else ""
                print(f"{label:8} {rows:5} x {k:5} -> {n:6}{gelu}  {cells}  | fastest {fastest} | {picks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
