"""Qwen3-VL's bench hooks (``ffai.bench.hooks.BenchHooks``), named by ``Qwen3VLEngine.bench``:
random-weight checkpoints written with transformers (``checkpoints``) and transformers as the
reference arm (``reference``), over the kit's hooks (``ffai.bench.engine_hooks``).

Only this package (and the tests) may import transformers; it does so inside the calls that need
it, so importing the hooks stays light.
"""

from __future__ import annotations

from ffai.bench.engine_hooks import KitBench
from ffai.engines.qwen3vl.bench.checkpoints import WRITER
from ffai.engines.qwen3vl.bench.reference import ReferenceArm
from ffai.engines.qwen3vl.stages import STAGES


def visual_tiles(model, encoded):
    """The vision tower's outputs as the agreement gate's tiles. A tile is one picture (a still, or
    a frame pair of a clip) in one output: the merged visual tokens, then each DeepStack feature,
    (tokens, D) each, stacked (4 x pictures, tokens, D), so every output the text tower takes is
    gated, each picture on its own as SmolVLM's tiles are."""
    import torch

    visual = encoded.visual
    counts = (visual.grid_thw.prod(-1) // model["vision"].net.cfg.vision.merge_unit).tolist()
    tiles = []
    for output in (visual.embeds, *visual.deepstack):
        for rows, frames in zip(output.split(counts), visual.grid_thw[:, 0].tolist()):
            tiles += list(rows.chunk(frames))
    if len({t.shape for t in tiles}) != 1:  # pictures of different sizes: one tile per output
        tiles = [visual.embeds, *visual.deepstack]
    return torch.stack(tiles)


HOOKS = KitBench(WRITER, ReferenceArm, STAGES, visual_tiles)
