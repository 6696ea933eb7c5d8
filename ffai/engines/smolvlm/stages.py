"""SmolVLM's stages on the kit (``ffai.kit.stages``): preprocess (Pillow → uint8 tiles + prompt
ids) → vision (tower + connector) → text (the kit's text tower and token loop). What is SmolVLM's
here is how a request becomes tiles and a prompt, and how tiles become image embeddings; the
factories, the loading and the text stage are the kit's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ffai.engines.contract import DecodingOptions, Request
from ffai.engines.smolvlm.engine import prompt_text, window_presentation
from ffai.kit.stages import Encoded, EngineStages

from .config import ModelConfig
from .precision import plan_precision
from .prompt import PromptBuilder
from .weights import NAMES

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class Prepared:
    """Output of the preprocess stage: what the vision and text stages need."""

    input_ids: list[int]
    tiles: "torch.Tensor"  # (n_tiles, 3, tile, tile) uint8: the vision stage normalises them
    pixel_attention_mask: "torch.Tensor"  # (n_tiles, tile, tile) bool
    options: DecodingOptions


class Preprocessor:
    """Stage 1: Pillow images → uint8 tiles and prompt ids. Needs no weights."""

    def __init__(self, model_dir: Path) -> None:
        from .preprocess import ProcessorConfig

        self.model_dir = model_dir
        self.processor = ProcessorConfig.from_dir(model_dir)
        self.prompts = PromptBuilder.from_dir(model_dir)

    def __call__(self, request: Request) -> Prepared:
        from .preprocess import preprocess_images

        if not request.still:
            how = window_presentation(request.options, self.processor.video is not None, self.model_dir)
            if how == "video":
                return self.video(request)
        # Idefics3 tiles a still (tiles + the global image) and gives each frame one image.
        batch = preprocess_images(request.images, self.processor, split=request.still)
        text = prompt_text(request.options, len(request.images), still=request.still)
        ids = self.prompts.build(batch.grids, text, self.processor.image_seq_len)
        return Prepared(ids, batch.tiles, batch.pixel_attention_mask, request.options)

    def video(self, request: Request) -> Prepared:
        """A window as its own clip (SmolVLM2): frame times from the window's start, the clip as
        long as the window's span."""
        from .video_frames import preprocess_video

        batch = preprocess_video(request.images, self.processor)
        start, end = request.span
        times = [t - start for t in request.times]
        text = prompt_text(request.options, len(request.images), still=False, video=True)
        ids = self.prompts.build_video(times, end - start, text, self.processor.image_seq_len)
        return Prepared(ids, batch.tiles, batch.pixel_attention_mask, request.options)


class VisionEncoder:
    """Stage 2: uint8 tiles → image embeddings (vision tower + connector), each tile normalised
    as the tower takes it (``preprocess.normalise``)."""

    def __init__(self, net, model_dir: Path) -> None:
        from .preprocess import ProcessorConfig, normalise

        self.net = net
        self.normalise = functools.partial(normalise, cfg=ProcessorConfig.from_dir(model_dir))

    def __call__(self, prepared: Prepared) -> Encoded:
        import torch

        with torch.inference_mode():
            embeds = self.net.encode_images(prepared.tiles, prepared.pixel_attention_mask, self.normalise)
        return Encoded(prepared.input_ids, embeds, prepared.options)


def build(cfg, parts, plan):
    """SmolVLM's model holding ``parts``, its vision tower and text prefill attending as ``plan`` says."""
    from .model import Idefics3

    return Idefics3(cfg, parts, plan.attention, plan.text_prefill)


STAGES = EngineStages(NAMES, ModelConfig, PromptBuilder, plan_precision, Preprocessor, VisionEncoder, build)
