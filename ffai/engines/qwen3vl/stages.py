"""Qwen3-VL's stages on the kit (``ffai.kit.stages``): preprocess (pictures → uint8 frames + grids +
prompt ids) → vision (tower → visual tokens and DeepStack features) → text (the kit's text tower
and token loop). What is Qwen3-VL's here is how a request becomes pictures and a prompt, and how
pictures become visual tokens; the factories, the loading and the text stage are the kit's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ffai.engines.contract import DecodingOptions, Request
from ffai.engines.qwen3vl.engine import check_presentation, processor_config, prompt_text
from ffai.kit.stages import Encoded, EngineStages

from .config import ModelConfig
from .precision import plan_precision
from .prompt import PromptBuilder
from .weights import NAMES

if TYPE_CHECKING:  # pragma: no cover
    from .preprocess import Pictures, ProcessorConfig


@dataclass
class Prepared:
    """Output of the preprocess stage: the pictures (uint8, cheap to hand to another process),
    whether they are a still or a clip, the settings that normalise them, and the prompt ids."""

    input_ids: list[int]
    pictures: "Pictures"
    video: bool
    processor: "ProcessorConfig"
    options: DecodingOptions


class Preprocessor:
    """Stage 1: PIL pictures → resized uint8 frames with their grids, and prompt ids. No weights."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.prompts = PromptBuilder.from_dir(model_dir)

    def __call__(self, request: Request) -> Prepared:
        from .preprocess import preprocess_images
        from .video_frames import clip_frames, preprocess_video

        options = request.options
        if request.still:
            cfg = processor_config(self.model_dir, options)
            pictures = preprocess_images(request.images, cfg)
            ids = self.prompts.build_images(pictures.grids, prompt_text(options, still=True), cfg)
            return Prepared(ids, pictures, False, cfg, options)
        # A window is its own clip: frame times from its start; the cues keep the source's times.
        check_presentation(options)
        cfg = processor_config(self.model_dir, options, len(request.images))
        frames, times = clip_frames(request.images, request.times, request.span[0])
        pictures = preprocess_video(frames, cfg)
        ids = self.prompts.build_video(pictures.grids[0], times, prompt_text(options, still=False), cfg)
        return Prepared(ids, pictures, True, cfg, options)


class VisionEncoder:
    """Stage 2: uint8 pictures → visual tokens and DeepStack features, each picture normalised and
    cut into patches as the processor does (``preprocess.pixel_values``, with the settings the
    pictures carry: the checkpoint's folder has nothing more to say)."""

    def __init__(self, net, model_dir: Path) -> None:
        self.net = net

    def __call__(self, prepared: Prepared) -> Encoded:
        import torch

        from .preprocess import pixel_values

        with torch.inference_mode():
            values = pixel_values(prepared.pictures, prepared.processor)
            visual = self.net.encode(values, prepared.pictures.grid_thw, video=prepared.video)
        return Encoded(prepared.input_ids, visual, prepared.options)


def build(cfg, parts, plan):
    """Qwen3-VL's model holding ``parts``, its vision tower attending as ``plan`` says."""
    from .model import Qwen3VL

    return Qwen3VL(cfg, parts, plan.attention)


STAGES = EngineStages(NAMES, ModelConfig, PromptBuilder, plan_precision, Preprocessor, VisionEncoder, build)
