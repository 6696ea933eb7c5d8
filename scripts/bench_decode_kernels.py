"""One-row (decode) products of SmolVLM-256M's text linears by each kernel torch offers, over a
step's worth of weights, all kernels timed in turn in one process.

    python scripts/bench_decode_kernels.py [--threads 1] [--repeats 15] [--inductor]

For each shape, ``--layers`` copies of a random int8 weight (30: the text tower's layers) are
multiplied by one row, one copy after the other, so the weights are read as a decode step reads
them (from memory, or from an L3 cache as large as the step's weights); the LM head (576 ->
49 280) is one weight. A row is never ``expand``-ed to more rows for ``torch._int_mm``: on the CPU
a stride-0 input gives wrong sums, fast (torch 2.14.1).
Kernels: ``torch._weight_int8pack_mm`` (int8 weight x bfloat16 row: what ``RowScaledLinear`` runs
for a decode row where the CPU has native bfloat16), fbgemm's dynamic int8 linear (the row
quantised to 8 bits with a zero point: ``QuantizedLinear``), ``torch._int_mm`` (the row quantised
symmetric to int8 by its own range: ``RowScaledLinear`` without native bfloat16), and oneDNN's
bfloat16 linear on a reordered weight (``PackedBf16Linear``); with ``--inductor`` also
``torch._weight_int8pack_mm`` compiled by inductor with freezing and max-autotune (the weights
constants, so its C++ GEMM template, AMX or AVX-512 micro-kernels, competes with the aten kernel;
minutes of compiling per shape). Prints ms per shape for all copies.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

ARMS = ("int8pack", "fbgemm", "_int_mm", "bf16 oneDNN", "inductor WOQ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--inductor", action="store_true", help="add inductor's frozen max-autotune int8 arm")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = {"qkv 576->960": (960, 576, args.layers), "o 576->576": (576, 576, args.layers)}
    shapes |= {"gate/up 576->3072": (3072, 576, args.layers), "down 1536->576": (576, 1536, args.layers)}
    shapes["LM head 576->49280"] = (49280, 576, 1)
    print(f"torch {torch.__version__}, {args.threads} thread(s), ms for all copies (median of {args.repeats})")
    arms = ARMS if args.inductor else ARMS[:-1]
    print(f"{'shape':<22}{'copies':>7}" + "".join(f"{a:>14}" for a in arms))
    for name, (n, k, copies) in shapes.items():
        ms = time_shape(n, k, copies, args.repeats, args.inductor)
        print(f"{name:<22}{copies:>7}" + "".join(f"{v:>14.2f}" for v in ms), flush=True)
    return 0


def time_shape(n: int, k: int, copies: int, repeats: int, inductor: bool) -> list[float]:
    """Median ms of each kernel over ``copies`` (n, k) weights, kernels timed in turn."""
    import torch

    from ffai.kit.opt_in_linears import pack_int8, quantize_rows, row_scales

    floats = [torch.randn(n, k) * 0.02 for _ in range(copies)]
    scales = [row_scales(w) for w in floats]
    int8 = [quantize_rows(w, s) for w, s in zip(floats, scales)]
    fbgemm = [pack_int8(w, None, "fbgemm") for w in floats]
    bf16 = [torch.ops.mkldnn._reorder_linear_weight(w.to(torch.bfloat16), 1) for w in floats]
    del floats
    unit = torch.ones(n, dtype=torch.bfloat16)
    x = torch.randn(1, k)

    def int8pack():
        for w, s in zip(int8, scales):
            torch._weight_int8pack_mm(x.to(torch.bfloat16), w, unit).float().mul_(s)

    def fbgemm_dynamic():
        for w in fbgemm:
            torch.ops.quantized.linear_dynamic(x, w, False)

    def int_mm():
        for w, s in zip(int8, scales):
            step = max(float(x.abs().max()), 1e-30) / 127.0
            torch.mul(torch._int_mm(torch.mul(x, 1.0 / step).round_().to(torch.int8), w.t()), s * step)

    def onednn_bf16():
        for w in bf16:
            torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), w, None, "none", [], "")

    arms = [int8pack, fbgemm_dynamic, int_mm, onednn_bf16]
    if inductor:
        arms.append(compiled_int8pack(int8, scales, unit, x))
    for arm in arms:
        arm()
    walls: dict = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm in arms:
            start = time.perf_counter()
            arm()
            walls[arm].append(time.perf_counter() - start)
    return [1e3 * statistics.median(walls[arm]) for arm in arms]


def compiled_int8pack(int8: list, scales: list, unit, x):
    """``int8pack``'s products as one frozen program compiled with max-autotune; checked against
    the aten kernel's sums before it is timed."""
    import torch
    from torch import nn

    class Copies(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i, (w, s) in enumerate(zip(int8, scales)):
                self.register_buffer(f"w{i}", w)
                self.register_buffer(f"s{i}", s)
            self.register_buffer("unit", unit)

        def forward(self, row):
            rows = row.to(torch.bfloat16)
            ws = [getattr(self, f"w{i}") for i in range(len(int8))]
            ss = [getattr(self, f"s{i}") for i in range(len(int8))]
            return [torch._weight_int8pack_mm(rows, w, self.unit).float() * s for w, s in zip(ws, ss)]

    module = Copies().eval()
    options = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
    step = torch.compile(module, fullgraph=True, options=options)
    with torch.no_grad():
        for got, want in zip(step(x), module(x)):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-3)

    def inductor_woq():
        with torch.no_grad():
            step(x)

    return inductor_woq


if __name__ == "__main__":
    sys.exit(main())
