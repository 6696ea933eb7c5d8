"""Qwen3-VL's agreement probes for the bench (``ffai.bench.agreement``): what its stages compute on
the way to an answer, read from an ``InlineEngine`` of the qwen3-vl engine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ffai.engines.contract import Request

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ffai.run.inline import InlineEngine


def text_weights(model_dir: Path) -> int:
    """How many weights the text tower (embedding table, layers, final norm) and the LM head hold,
    counted from config.json, as SmolVLM's probe counts them (a decode step reads one row of the
    embedding table, so this floor is the loose one)."""
    from ffai.engines.qwen3vl.config import ModelConfig

    cfg = ModelConfig.from_dir(model_dir)
    t = cfg.text
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    attention = t.hidden_size * (q + 2 * kv) + q * t.hidden_size + 2 * t.head_dim  # q/k RMSNorm weights
    if t.attention_bias:
        attention += q + 2 * kv + t.hidden_size
    layer = attention + 3 * t.hidden_size * t.intermediate_size + 2 * t.hidden_size  # two RMSNorm weights
    embed = t.vocab_size * t.hidden_size
    head = 0 if cfg.tie_word_embeddings else t.vocab_size * t.hidden_size
    return embed + t.num_hidden_layers * layer + t.hidden_size + head


def _state(model: "InlineEngine", encoded):
    from ffai.engines.qwen3vl.generate import prompt_state

    images, videos = (None, encoded.visual) if encoded.video else (encoded.visual, None)
    return prompt_state(model["text"].net, encoded.input_ids, images, videos)


def prefill_logits(model: "InlineEngine", encoded) -> "torch.Tensor":
    """(vocab,) the logits the prompt (visual tokens and DeepStack features merged in) gives for
    the first new token."""
    import torch

    from ffai.engines.qwen3vl.generate import prefill

    net = model["text"].net
    with torch.inference_mode():
        ids, positions, _, (x, deepstack) = _state(model, encoded)
        return prefill(net, x, positions, net.text.reserve_cache(1, ids.shape[1]), deepstack)[0]


def features_and_logits(model: "InlineEngine", request: Request) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The vision tower's outputs as the agreement gate's tiles, and the (vocab,) prefill logits.

    A tile is one picture (a still, or a frame pair of a clip) in one output: the merged visual
    tokens, then each DeepStack feature, (tokens, D) each, stacked (4 x pictures, tokens, D), so
    every output the text tower takes is gated, each picture on its own as SmolVLM's tiles are."""
    import torch

    encoded = model.through(request, "vision")
    visual = encoded.visual
    counts = (visual.grid_thw.prod(-1) // model["vision"].net.cfg.vision.merge_unit).tolist()
    tiles = []
    for output in (visual.embeds, *visual.deepstack):
        for rows, frames in zip(output.split(counts), visual.grid_thw[:, 0].tolist()):
            tiles += list(rows.chunk(frames))
    if len({t.shape for t in tiles}) != 1:  # pictures of different sizes: one tile per output
        tiles = [visual.embeds, *visual.deepstack]
    return torch.stack(tiles), prefill_logits(model, encoded)


def timed_tokens(model: "InlineEngine", request: Request) -> tuple[list[int], float, list[float]]:
    """The tokens, the seconds to the first one, and the seconds between each token and the next.
    The visual tokens come first, untimed; the callback only takes the time (decoding each token
    to text would compete for the cores, as SmolVLM's probe explains)."""
    import torch

    from ffai.engines.qwen3vl.generate import generate

    encoded = model.through(request, "vision")
    decoder = model["text"]
    images, videos = (None, encoded.visual) if encoded.video else (encoded.visual, None)
    stamps: list[float] = []
    start = time.perf_counter()
    with torch.inference_mode():
        tokens = generate(
            decoder.net,
            encoded.input_ids,
            images,
            videos,
            encoded.options,
            decoder.stop_ids,
            lambda _: stamps.append(time.perf_counter()),
        )
    return tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]


# --- the stage-by-stage probe behind the precision plan (docs/benchmarks.md) -------------------
#
#     python -m ffai.engines.qwen3vl.bench.probes MODEL_DIR CASES VARIANT[,VARIANT...] [--vision-only]
#
# One float32 model is loaded; each variant's linears are built from its float32 weights, swapped
# in, run on the bench's cases and swapped back, so every variant is compared with the same
# float32 outputs and only one model's weights stay resident.


def variants() -> dict:
    """Named precision plans for this CPU: the dtypes' own (``bf_plan``, ``i8_plan``) and the
    probe's ablations (every linear a variant's first pattern leaves out stays float32). The int8
    ablations start from the first int8 plan, whose vision blocks 4-23 were int8 x int8
    (``i8_vision_int8``), as docs/benchmarks.md measured them."""
    import dataclasses

    import torch

    from ffai.engines.qwen3vl.precision import (
        BF16_ONEDNN,
        FLOAT32,
        HEAD,
        INT8,
        INT8_BY_ROW,
        INT8_ONEDNN,
        MERGERS,
        VISION,
        WIDE_TEXT,
        WIDE_VISION,
        plan_precision,
    )
    from ffai.kit import host
    from ffai.kit.linear_kinds import ONEDNN_INT8_FLAGS

    bf, i8 = plan_precision("bfloat16"), plan_precision("int8")
    wide = BF16_ONEDNN if i8.rows_dtype == torch.bfloat16 else FLOAT32
    tile = INT8_ONEDNN if host.cpu_info().flags & ONEDNN_INT8_FLAGS else INT8
    first = ((WIDE_VISION, wide), (WIDE_TEXT, wide), (MERGERS, INT8_BY_ROW), (VISION, tile), (HEAD, INT8))
    first += ((r".", INT8_BY_ROW),)
    no_wide = first[2:]
    text, vision = ((r"visual\.", FLOAT32),), ((r"text\.", FLOAT32),)
    by_row = tuple((p, INT8_BY_ROW if k.startswith("int8") else k) for p, k in first)
    plans = {
        "bf_all": bf.linears[1:],
        "bf_plan": bf.linears,
        "i8_plan": i8.linears,
        "i8_vision_int8": first,
        "i8_nowide": no_wide,
        "i8_text_only": text + first,
        "i8_text_only_nowide": text + no_wide,
        "i8_vision_only": vision + first,
        "i8_vision_only_nowide": vision + no_wide,
        "i8_vision_only_rows": vision + by_row,
        "i8_vision_only_wide05": vision + ((r"visual\.blocks\.[0-5]\.", wide),) + first[1:],
    }
    return {n: dataclasses.replace(bf if n.startswith("bf") else i8, linears=lin) for n, lin in plans.items()}


def stage_outputs(model, prepared: dict) -> dict:
    """Per case: the visual tokens, the DeepStack features and (with a text tower) the prefill logits."""
    import torch

    from ffai.engines.qwen3vl import generate as G
    from ffai.engines.qwen3vl.preprocess import pixel_values

    out = {}
    with torch.inference_mode():
        for case, p in prepared.items():
            visual = model.encode(pixel_values(p.pictures, p.processor), p.pictures.grid_thw)
            out[case] = [visual.embeds, *visual.deepstack]
            if model.text is not None:
                images, videos = (None, visual) if p.video else (visual, None)
                ids, positions, _, (x, deepstack) = G.prompt_state(model, p.input_ids, images, videos)
                out[case].append(G.prefill(model, x, positions, model.text.new_cache(1, ids.shape[1]), deepstack)[0])
    return out


def swapped(model, plan, prepared: dict) -> dict:
    """``stage_outputs`` with ``plan``'s linears (and vision attention, patch embedding) swapped
    into the float32 ``model``, which is restored after."""
    from torch import nn

    from ffai.engines.qwen3vl.layers import Linear
    from ffai.engines.qwen3vl.precision import FLOAT32, PLAIN, build_linear

    originals = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    embed = model.visual.patch_embed.proj
    kept = embed.weight, embed.bias
    try:
        for name, linear in originals.items():
            kind = plan.linear(name)
            if kind == FLOAT32 or (kind == PLAIN and plan.weights == linear.weight.dtype):
                continue
            if kind == PLAIN:
                new = Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
                new.weight = nn.Parameter(linear.weight.to(plan.weights), requires_grad=False)
                new.bias = None if linear.bias is None else nn.Parameter(linear.bias.to(plan.weights), False)
            else:
                new = build_linear(kind, linear.weight, linear.bias, plan)
            model.set_submodule(name, new)
        embed.weight, embed.bias = (nn.Parameter(t.to(plan.weights), requires_grad=False) for t in kept)
        for block in model.visual.blocks:
            block.attn.attention_dtype = plan.vision_attention
        return stage_outputs(model, prepared)
    finally:
        for name, linear in originals.items():
            model.set_submodule(name, linear)
        embed.weight, embed.bias = kept
        for block in model.visual.blocks:
            block.attn.attention_dtype = None


def main(argv: list[str] | None = None) -> None:
    import argparse

    from ffai.bench import cases
    from ffai.bench.agreement import cosine
    from ffai.engines.qwen3vl.stages import Preprocessor
    from ffai.engines.qwen3vl.weights import load_model

    known = variants()
    parser = argparse.ArgumentParser(prog="python -m ffai.engines.qwen3vl.bench.probes")
    parser.add_argument("model", type=Path)
    parser.add_argument("cases", help="bench cases, comma-separated (frame, still, window)")
    parser.add_argument("variants", help=f"comma-separated, of: {', '.join(known)}")
    parser.add_argument("--vision-only", action="store_true", help="load the vision tower alone")
    args = parser.parse_args(argv)
    model = load_model(args.model, parts=("vision",) if args.vision_only else ("vision", "text"))
    pre = Preprocessor(args.model)
    prepared = {c: pre(cases.items(c)[0].request(cases.decoding())) for c in args.cases.split(",")}
    exact = stage_outputs(model, prepared)
    for name in args.variants.split(","):
        got = swapped(model, known[name], prepared)
        figures = {c: [round(cosine(a, b), 6) for a, b in zip(got[c], exact[c])] for c in got}
        print(name, "cosines (visual tokens, DeepStack..., logits):", figures, flush=True)


if __name__ == "__main__":
    main()
