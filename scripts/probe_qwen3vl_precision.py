"""The stage-by-stage probe behind Qwen3-VL's precision plan (docs/benchmarks.md): how far each
variant of the plan moves the visual tokens, the DeepStack features and the prefill logits from
float32's, case by case.

    python scripts/probe_qwen3vl_precision.py MODEL_DIR CASES VARIANT[,VARIANT...] [--vision-only]

One float32 model is loaded; each variant's linears are built from its float32 weights, swapped
in, run on the bench's cases and swapped back, so every variant is compared with the same float32
outputs and only one model's weights stay resident.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from torch import nn

from ffai.bench import cases
from ffai.bench.agreement import cosine
from ffai.engines.qwen3vl.precision import HEAD, MERGERS, VISION, WIDE_TEXT, WIDE_VISION, plan_precision
from ffai.engines.qwen3vl.preprocess import pixel_values
from ffai.engines.qwen3vl.stages import STAGES, Preprocessor
from ffai.kit import host
from ffai.kit.generate import prefill
from ffai.kit.linear_kinds import BF16_ONEDNN, FLOAT32, INT8, INT8_BY_ROW, INT8_ONEDNN, ONEDNN_INT8_FLAGS, PLAIN
from ffai.kit.linears import Linear
from ffai.kit.precision import opt_in_linear


def variants() -> dict:
    """Named precision plans for this CPU: the dtypes' own (``bf_plan``, ``i8_plan``) and the
    probe's ablations (every linear a variant's first pattern leaves out stays float32). The int8
    ablations start from the first int8 plan, whose vision blocks 4-23 were int8 x int8
    (``i8_vision_int8``), as docs/benchmarks.md measured them."""
    bf, i8 = plan_precision("bfloat16"), plan_precision("int8")
    wide = BF16_ONEDNN if i8.int8.rows_dtype == torch.bfloat16 else FLOAT32
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
    out = {}
    with torch.inference_mode():
        for case, p in prepared.items():
            visual = model.encode(pixel_values(p.pictures, p.processor), p.pictures.grid_thw, video=p.video)
            out[case] = [visual.embeds, *visual.deepstack]
            if model.text is not None:
                images, videos = (None, visual) if p.video else (visual, None)
                prompt = model.prompt_of(p.input_ids, images, videos)
                out[case].append(prefill(model.text, prompt, model.text.new_cache(1, prompt.length))[0])
    return out


def swapped(model, plan, prepared: dict) -> dict:
    """``stage_outputs`` with ``plan``'s linears (and vision attention, patch embedding) swapped
    into the float32 ``model``, which is restored after."""
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
                new = opt_in_linear(plan, name, linear.weight, linear.bias, getattr(linear, "parts", ()))
            model.set_submodule(name, new)
        embed.weight, embed.bias = (nn.Parameter(t.to(plan.weights), requires_grad=False) for t in kept)
        for block in model.visual.blocks:
            block.attn.attention_dtype = plan.attention.dtype
        return stage_outputs(model, prepared)
    finally:
        for name, linear in originals.items():
            model.set_submodule(name, linear)
        embed.weight, embed.bias = kept
        for block in model.visual.blocks:
            block.attn.attention_dtype = None


def main(argv: list[str] | None = None) -> None:
    known = variants()
    parser = argparse.ArgumentParser(prog="python scripts/probe_qwen3vl_precision.py")
    parser.add_argument("model", type=Path)
    parser.add_argument("cases", help="bench cases, comma-separated (frame, still, window)")
    parser.add_argument("variants", help=f"comma-separated, of: {', '.join(known)}")
    parser.add_argument("--vision-only", action="store_true", help="load the vision tower alone")
    args = parser.parse_args(argv)
    model = STAGES.load_model(args.model, parts=("vision",) if args.vision_only else None)
    pre = Preprocessor(args.model)
    prepared = {c: pre(cases.items(c)[0].request(cases.decoding())) for c in args.cases.split(",")}
    exact = stage_outputs(model, prepared)
    for name in args.variants.split(","):
        got = swapped(model, known[name], prepared)
        figures = {c: [round(cosine(a, b), 6) for a, b in zip(got[c], exact[c])] for c in got}
        print(name, "cosines (visual tokens, DeepStack..., logits):", figures, flush=True)


if __name__ == "__main__":
    main()
