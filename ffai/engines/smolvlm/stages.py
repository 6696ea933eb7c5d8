"""SmolVLM's three stages, each built by a factory the pipeline calls in the process that runs it.

preprocess (Pillow → tiles + prompt ids) → vision (tower + connector) → text (text tower with a
static KV cache). Nothing here knows about processes, threads or the CLI.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ffai.engines.contract import Answer, DecodingOptions, Request, RuntimeOptions
from ffai.engines.smolvlm.engine import prompt_text, window_presentation
from ffai.engines.smolvlm.loading import load_weights
from ffai.kit.tokenizing import generate_streamed

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class Prepared:
    """Output of the preprocess stage: what the vision and text stages need."""

    input_ids: list[int]
    tiles: "torch.Tensor"  # (n_tiles, 3, tile, tile) uint8: the vision stage normalises them
    pixel_attention_mask: "torch.Tensor"  # (n_tiles, tile, tile) bool
    options: DecodingOptions


@dataclass
class Encoded:
    """Output of the vision stage: prompt ids and the image embeddings to merge into them."""

    input_ids: list[int]
    image_embeds: "torch.Tensor"  # (n_tiles, image_seq_len, text hidden)
    options: DecodingOptions


class Preprocessor:
    """Stage 1: Pillow images → uint8 tiles and prompt ids. Needs no weights."""

    def __init__(self, model_dir: Path) -> None:
        from ffai.engines.smolvlm.preprocess import ProcessorConfig
        from ffai.engines.smolvlm.prompt import PromptBuilder

        self.model_dir = model_dir
        self.processor = ProcessorConfig.from_dir(model_dir)
        self.prompts = PromptBuilder.from_dir(model_dir)

    def __call__(self, request: Request) -> Prepared:
        from ffai.engines.smolvlm.preprocess import preprocess_images

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
        from ffai.engines.smolvlm.video_frames import preprocess_video

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
        from ffai.engines.smolvlm.preprocess import ProcessorConfig, normalise

        self.net = net
        self.normalise = functools.partial(normalise, cfg=ProcessorConfig.from_dir(model_dir))

    def __call__(self, prepared: Prepared) -> Encoded:
        import torch

        with torch.inference_mode():
            embeds = self.net.encode_images(prepared.tiles, prepared.pixel_attention_mask, self.normalise)
        return Encoded(prepared.input_ids, embeds, prepared.options)


class TextDecoder:
    """Stage 3: prompt ids + image embeddings → the answer (text tower, static KV cache)."""

    def __init__(self, net, model_dir: Path) -> None:
        from ffai.engines.smolvlm.prompt import PromptBuilder

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

        from ffai.engines.smolvlm.generate import generate

        ids = torch.tensor([encoded.input_ids], device=self.net.device)
        with torch.inference_mode():
            return generate(self.net, ids, encoded.image_embeds, encoded.options, self.stop_ids, on_token)


# Stage factories, called in worker processes as factory(model_dir, runtime).


def preprocess_stage(model_dir: str, runtime: RuntimeOptions) -> Preprocessor:
    return Preprocessor(Path(model_dir))


def vision_stage(model_dir: str, runtime: RuntimeOptions) -> VisionEncoder:
    return VisionEncoder(load_weights(Path(model_dir), runtime, parts=("vision",)), Path(model_dir))


def text_stage(model_dir: str, runtime: RuntimeOptions) -> TextDecoder:
    return TextDecoder(load_weights(Path(model_dir), runtime, parts=("text",)), Path(model_dir))
