"""What decoding several windows together buys on this CPU, side by side in one run.

    python scripts/bench_decode_batch.py [--batch 1,2,4] [--steps 12] [--threads 2] [--dtype D] [--model DIR]

B sequences, each with its own prompt length and KV cache (as windows in flight have), take
decode steps through the engine's text tower in four schedules:

- ``serial``: the engine's own forward, one sequence's whole step after another: what ffai
  does, and what the reference does window by window (one-row matmuls everywhere).
- ``interleaved``: every sequence through one weight before the next weight is touched, so the
  second sequence finds the weight in cache. Still one-row matmuls: bit for bit ``serial``.
- ``stacked``: one B-row matmul per weight, the usual "batched decode". MKL picks another
  kernel for B rows, so the logits differ from ``serial`` in the last bits; the script prints
  whether they are equal and whether the greedy tokens still agree.
- ``rows``: what ffai runs (``ffai.kit.text_tower.TextModel.decode_rows``, ``--batch``): one
  step for all rows, each row's products as it would be alone, so bit for bit ``serial``.

Printed per B: milliseconds per step (median over ``--steps``) and the time relative to
``serial`` at the same B, measured in the same run (1.00 = no saving; 1/B would be one
sequence's cost for all B). Weights are random with the real
SmolVLM-256M shapes (the default checkpoint of the tests): time does not depend on their values.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

SCHEDULES = ("serial", "interleaved", "stacked", "rows")


def project(hs: list, weight, bias, schedule: str) -> list:
    """Each sequence's (1, 1, D) input through one linear, in the schedule's way."""
    import torch
    import torch.nn.functional as F

    from ffai.kit.linears import linear

    if schedule == "stacked" and len(hs) > 1:
        return list(F.linear(torch.cat(hs), weight, bias).split(1))
    return [linear(h, weight, bias) for h in hs]


def layer_step(layer, xs: list, seqs: list, schedule: str) -> list:
    """One decoder layer for every sequence, in the schedule's order; each sequence's arithmetic
    is the kit's (``ffai.kit.text_tower.DecoderLayer``), which the bit-equality with ``serial`` checks."""
    import torch.nn.functional as F

    from ffai.kit.rope import apply_rope

    attn, mlp = layer.self_attn, layer.mlp
    h, kv, hd = attn.n_heads, attn.n_kv, attn.head_dim
    normed = [layer.input_layernorm(x) for x in xs]
    qkvs = project(normed, attn.qkv.weight, attn.qkv.bias, schedule)
    ys = []
    for qkv, seq in zip(qkvs, seqs):
        qkv = qkv.view(1, 1, h + 2 * kv, hd)
        q, k = apply_rope(qkv[:, :, : h + kv].transpose(1, 2), *seq["rope"]).split([h, kv], dim=1)
        v = qkv[:, :, h + kv :].transpose(1, 2)
        k, v = seq["cache"].update(attn.layer, seq["slot"], k, v)
        ys.append(attn._attend(q, k, v).transpose(1, 2).reshape(1, 1, -1))
    xs = [x + o for x, o in zip(xs, project(ys, attn.o_proj.weight, attn.o_proj.bias, schedule))]
    normed = [layer.post_attention_layernorm(x) for x in xs]
    gate_ups = project(normed, mlp.gate_up.weight, mlp.gate_up.bias, schedule)
    gated = [F.silu(g) * u for g, u in (gu.chunk(2, dim=-1) for gu in gate_ups)]
    return [x + d for x, d in zip(xs, project(gated, mlp.down_proj.weight, mlp.down_proj.bias, schedule))]


def step(tower, tokens, seqs: list, schedule: str) -> list:
    """One decode step for every sequence's token -> each sequence's (1, 1, vocab) logits."""

    if schedule == "rows":
        return list(tower.decode_rows(tokens, [(s["cache"], s["pos"], s["pos"]) for s in seqs])[:, None].split(1))
    xs = list(tower.embed(tokens[:, None]).split(1))
    if schedule == "serial":  # the tower's own forward, one sequence after another
        return [
            tower(x, tower.rope_rows(seq["pos"], seq["pos"] + 1), slice(seq["pos"], seq["pos"] + 1), seq["cache"])
            for x, seq in zip(xs, seqs)
        ]
    for seq in seqs:
        seq["rope"], seq["slot"] = tower.rope_rows(seq["pos"], seq["pos"] + 1), slice(seq["pos"], seq["pos"] + 1)
    for layer in tower.layers:
        xs = layer_step(layer, xs, seqs, schedule)
    return project([tower.norm(x) for x in xs], tower.lm_head.weight, None, schedule)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,2,4", help="numbers of sequences decoded together")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="the text tower's dtype, as ffai caption --dtype")
    parser.add_argument("--model", help="checkpoint folder (default: the real-shape random test checkpoint)")
    args = parser.parse_args()

    import torch

    from ffai.bench import checkpoints
    from ffai.engines.contract import RuntimeOptions
    from ffai.run.inline import InlineEngine

    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model else checkpoints.checkpoint("real")
    tower = InlineEngine.load("smolvlm", path, RuntimeOptions(dtype=args.dtype, threads=args.threads, device="cpu"))[
        "text"
    ].net.text
    print(f"checkpoint {path.name}, {args.dtype}, torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{'B':>3}{'schedule':>13}{'ms/step':>10}{'vs serial':>11}  logits vs serial")
    # interleaved and stacked take the float weights apart; the other dtypes' linears are not plain.
    schedules = SCHEDULES if args.dtype == "float32" else ("serial", "rows")
    with torch.inference_mode():
        for b in (int(v) for v in args.batch.split(",")):
            times, logits = {}, {}
            for schedule in schedules:
                gen = torch.Generator().manual_seed(b)
                seqs = []
                for i in range(b):  # prompts of different lengths, each in its own cache
                    length = 90 + 7 * i
                    cache = tower.new_cache(1, length + args.steps + 1)
                    prompt = torch.randn(1, length, tower.cfg.hidden_size, generator=gen).to(tower.dtype)
                    tower(prompt, tower.rope_rows(0, length), slice(0, length), cache)
                    seqs.append({"cache": cache, "pos": length})
                tokens = torch.randint(0, tower.cfg.vocab_size, (b,), generator=gen)
                step(tower, tokens, seqs, schedule)  # warm-up (writes position pos; overwritten below)
                samples = []
                for _ in range(args.steps):
                    start = time.perf_counter()
                    out = step(tower, tokens, seqs, schedule)
                    samples.append(time.perf_counter() - start)
                    for seq in seqs:
                        seq["pos"] += 1
                times[schedule], logits[schedule] = statistics.median(samples), out
            for schedule in schedules:
                same = all(torch.equal(a, c) for a, c in zip(logits[schedule], logits["serial"]))
                agree = all(int(a.argmax()) == int(c.argmax()) for a, c in zip(logits[schedule], logits["serial"]))
                verdict = "bit-identical" if same else f"differ (argmax {'agrees' if agree else 'DIFFERS'})"
                print(
                    f"{b:>3}{schedule:>13}{times[schedule] * 1e3:>10.1f}{times[schedule] / times['serial']:>10.2f}x  {verdict}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
