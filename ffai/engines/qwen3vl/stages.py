"""Qwen3-VL's three stages, each built by a factory the pipeline calls in the process that runs it.

preprocess (pictures → uint8 frames + grids + prompt ids) → vision (tower → visual tokens and
DeepStack features) → text (text tower with a static KV cache). Nothing here knows about
processes, threads or the CLI.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ffai import messages
from ffai.engines.contract import Answer, DecodingOptions, Request, RuntimeOptions
from ffai.engines.qwen3vl.engine import check_presentation, processor_config, prompt_text
from ffai.errors import UsageError
from ffai.kit.tokenizing import generate_streamed

if TYPE_CHECKING:  # pragma: no cover
    from ffai.engines.qwen3vl.model import Visual
    from ffai.engines.qwen3vl.preprocess import Pictures, ProcessorConfig


@dataclass
class Prepared:
    """Output of the preprocess stage: the pictures (uint8, cheap to hand to another process),
    whether they are a still or a clip, the settings that normalise them, and the prompt ids."""

    input_ids: list[int]
    pictures: "Pictures"
    video: bool
    processor: "ProcessorConfig"
    options: DecodingOptions


@dataclass
class Encoded:
    """Output of the vision stage: prompt ids and what the vision tower made of the pictures."""

    input_ids: list[int]
    visual: "Visual"
    video: bool
    options: DecodingOptions


class Preprocessor:
    """Stage 1: PIL pictures → resized uint8 frames with their grids, and prompt ids. No weights."""

    def __init__(self, model_dir: Path) -> None:
        from ffai.engines.qwen3vl.prompt import PromptBuilder

        self.model_dir = model_dir
        self.prompts = PromptBuilder.from_dir(model_dir)

    def __call__(self, request: Request) -> Prepared:
        from ffai.engines.qwen3vl.preprocess import preprocess_images
        from ffai.engines.qwen3vl.video_frames import clip_frames, preprocess_video

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
    cut into patches as the processor does (``preprocess.pixel_values``)."""

    def __init__(self, net) -> None:
        self.net = net

    def __call__(self, prepared: Prepared) -> Encoded:
        import torch

        from ffai.engines.qwen3vl.preprocess import pixel_values

        with torch.inference_mode():
            values = pixel_values(prepared.pictures, prepared.processor)
            visual = self.net.encode(values, prepared.pictures.grid_thw)
        return Encoded(prepared.input_ids, visual, prepared.video, prepared.options)


class TextDecoder:
    """Stage 3: prompt ids + visual tokens → the answer (text tower, static KV cache)."""

    def __init__(self, net, model_dir: Path) -> None:
        from ffai.engines.qwen3vl.prompt import PromptBuilder

        self.net = net
        self.prompts = PromptBuilder.from_dir(model_dir)
        self.stop_ids = self.prompts.stop_ids()

    def __call__(self, encoded: Encoded, on_text: Callable[[str], None] | None = None) -> Answer:
        """The answer; with ``on_text``, also its text piece by piece as it is generated (the
        pieces add up to ``Answer.text``)."""
        if on_text is None:
            ids = self.generate_ids(encoded)
        else:
            ids = generate_streamed(functools.partial(self.generate_ids, encoded), self.prompts.text_stream(), on_text)
        return Answer(self.prompts.decode(ids), tuple(ids))

    def generate_ids(self, encoded: Encoded, on_token: Callable[[int], None] | None = None) -> list[int]:
        import torch

        from ffai.engines.qwen3vl.generate import generate

        images, videos = (None, encoded.visual) if encoded.video else (encoded.visual, None)
        with torch.inference_mode():
            return generate(self.net, encoded.input_ids, images, videos, encoded.options, self.stop_ids, on_token)


def load(model_dir: Path, runtime: RuntimeOptions, part: str):
    """One part of the model ("vision" or "text") in ``runtime``'s dtype, on its device."""
    import torch

    from ffai.engines.qwen3vl.precision import device_for
    from ffai.engines.qwen3vl.weights import load_model

    device = device_for(runtime.dtype, runtime.device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if runtime.compile and part == "text":
        messages.warn("--compile: the qwen3-vl engine compiles nothing; it runs uncompiled")
    return load_model(model_dir, runtime.dtype, parts=(part,)).to(device)


# Stage factories, called in worker processes as factory(model_dir, runtime).


def preprocess_stage(model_dir: str, runtime: RuntimeOptions) -> Preprocessor:
    return Preprocessor(Path(model_dir))


def vision_stage(model_dir: str, runtime: RuntimeOptions) -> VisionEncoder:
    return VisionEncoder(load(Path(model_dir), runtime, "vision"))


def text_stage(model_dir: str, runtime: RuntimeOptions) -> TextDecoder:
    return TextDecoder(load(Path(model_dir), runtime, "text"), Path(model_dir))
