"""The engine object behind the ``smolvlm`` entry point, and the loaded model's three stages.

preprocess (Pillow → tiles + prompt ids) → encode (vision tower + connector) → generate
(text tower with a static KV cache). ``describe`` chains them for direct library use; the
worker pipeline runs them as separate stages. Nothing here knows about processes or the CLI.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ffai.engine import Answer, DecodingOptions, DescribeRequest, EngineInfo, RuntimeOptions, StageSpec
from ffai.errors import ModelError, UsageError
from ffai_smolvlm.loading import load_weights, release_free_heap

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

INFO = EngineInfo(
    name="smolvlm",
    task="vlm",
    # stable: gated token for token against transformers (tests/test_smolvlm_*.py, oracle marker)
    status="stable",
    description="SmolVLM / Idefics3 in plain PyTorch: SigLIP tower, pixel-shuffle connector, llama text tower",
    default_model="smolvlm-256m-instruct",
)

STILL_PROMPT = "Describe this image."
FRAMES_PROMPT = "Describe what happens in these frames."


def prompt_text(options: DecodingOptions, n_images: int, split: bool) -> str:
    """The question asked: the user's ``--prompt``, else a caption request that fits the input."""
    if options.prompt is not None:
        return options.prompt
    return STILL_PROMPT if split or n_images == 1 else FRAMES_PROMPT


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


class SmolVLMEngine:
    info = INFO

    def check_window(self, model_dir: Path, n_images: int, options: DecodingOptions, *, split: bool) -> None:
        from ffai_smolvlm.config import ModelConfig
        from ffai_smolvlm.preprocess import ProcessorConfig
        from ffai_smolvlm.prompt import PromptBuilder

        config = ModelConfig.from_dir(model_dir)
        processor = ProcessorConfig.from_dir(model_dir)
        builder = PromptBuilder.from_dir(model_dir)
        _check_files_agree(model_dir, config, processor, builder)
        grids = [(0, 0)] * n_images
        prompt_len = builder.count_tokens(grids, prompt_text(options, n_images, split), processor.image_seq_len)
        context = config.text.max_position_embeddings
        if prompt_len + options.max_new_tokens > context:
            raise UsageError(
                f"--window {n_images}: {n_images} frames make a {prompt_len}-token prompt, which with "
                f"--max-new-tokens {options.max_new_tokens} exceeds the model's context of {context} tokens; "
                f"use a smaller --window"
            )

    def load(self, model_dir: Path, runtime: RuntimeOptions) -> "SmolVLMModel":
        return SmolVLMModel(model_dir, runtime)

    def stages(self) -> tuple[StageSpec, ...]:
        # Preprocessing shares the vision worker: it is light, and its tiles then stay local.
        return (
            StageSpec("preprocess", f"{__name__}:preprocess_stage", process="vision"),
            StageSpec("vision", f"{__name__}:vision_stage", process="vision"),
            StageSpec("text", f"{__name__}:text_stage", process="text"),
        )


ENGINE = SmolVLMEngine()


def _check_files_agree(model_dir: Path, config, processor, builder) -> None:
    """The processor and tokenizer files come from the same checkpoint as config.json: the prompt
    holds as many image tokens per tile as the towers make, and they are the token the model
    replaces with image embeddings. A mixed folder would otherwise fail only after loading."""
    from ffai_smolvlm.config import CONFIG_FILE
    from ffai_smolvlm.preprocess import PROCESSOR_FILE
    from ffai_smolvlm.prompt import IMAGE, TOKENIZER_FILE

    if processor.image_seq_len != config.image_seq_len:
        raise ModelError(
            f"{model_dir / PROCESSOR_FILE}: image_seq_len {processor.image_seq_len} does not match "
            f"{model_dir / CONFIG_FILE}, whose tiles make {config.image_seq_len} image tokens each; "
            "the two files come from different checkpoints"
        )
    if builder.image_token_id != config.image_token_id:
        raise ModelError(
            f"{model_dir / TOKENIZER_FILE}: {IMAGE} is token {builder.image_token_id}, but "
            f"{model_dir / CONFIG_FILE} has image_token_id {config.image_token_id}; "
            "the two files come from different checkpoints"
        )


class Preprocessor:
    """Stage 1: Pillow images → uint8 tiles and prompt ids. Needs no weights."""

    def __init__(self, model_dir: Path) -> None:
        from ffai_smolvlm.preprocess import ProcessorConfig
        from ffai_smolvlm.prompt import PromptBuilder

        self.processor = ProcessorConfig.from_dir(model_dir)
        self.prompts = PromptBuilder.from_dir(model_dir)

    def __call__(self, request: DescribeRequest) -> Prepared:
        from ffai_smolvlm.preprocess import preprocess_images

        batch = preprocess_images(request.images, self.processor, split=request.split)
        text = prompt_text(request.options, len(request.images), request.split)
        ids = self.prompts.build(batch.grids, text, self.processor.image_seq_len)
        release_free_heap()
        return Prepared(ids, batch.tiles, batch.pixel_attention_mask, request.options)


class VisionEncoder:
    """Stage 2: uint8 tiles → image embeddings (vision tower + connector), each tile normalised
    as the tower takes it (``preprocess.normalise``)."""

    def __init__(self, net, model_dir: Path) -> None:
        from ffai_smolvlm.preprocess import ProcessorConfig, normalise

        self.net = net
        self.normalise = functools.partial(normalise, cfg=ProcessorConfig.from_dir(model_dir))

    def __call__(self, prepared: Prepared) -> Encoded:
        import torch

        with torch.inference_mode():
            embeds = self.net.encode_images(prepared.tiles, prepared.pixel_attention_mask, self.normalise)
        release_free_heap()
        return Encoded(prepared.input_ids, embeds, prepared.options)


class TextDecoder:
    """Stage 3: prompt ids + image embeddings → the answer (text tower, static KV cache)."""

    def __init__(self, net, model_dir: Path) -> None:
        from ffai_smolvlm.prompt import PromptBuilder

        self.net = net
        self.prompts = PromptBuilder.from_dir(model_dir)
        self.stop_ids = self.prompts.stop_ids()

    def __call__(self, encoded: Encoded, on_text: Callable[[str], None] | None = None) -> Answer:
        """The answer; with ``on_text``, also its text piece by piece as it is generated (the
        pieces add up to ``Answer.text``)."""
        if on_text is None:
            ids = self.generate_ids(encoded)
        else:
            stream = self.prompts.text_stream()

            def on_token(token_id: int) -> None:
                if piece := stream.step(token_id):
                    on_text(piece)

            ids = self.generate_ids(encoded, on_token)
            if rest := stream.finish():
                on_text(rest)
        release_free_heap()
        return Answer(self.prompts.decode(ids), tuple(ids))

    def generate_ids(self, encoded: Encoded, on_token: Callable[[int], None] | None = None) -> list[int]:
        import torch

        from ffai_smolvlm.generate import generate

        ids = torch.tensor([encoded.input_ids], device=self.net.device)
        with torch.inference_mode():
            return generate(self.net, ids, encoded.image_embeds, encoded.options, self.stop_ids, on_token)


class SmolVLMModel:
    """All three stages over one set of weights, in this process (library use, tests)."""

    def __init__(self, model_dir: Path, runtime: RuntimeOptions) -> None:
        net = load_weights(model_dir, runtime, parts=("vision", "text"))
        self.preprocessor = Preprocessor(model_dir)
        self.vision = VisionEncoder(net, model_dir)
        self.text = TextDecoder(net, model_dir)

    def preprocess(self, images: Sequence["Image.Image"], options: DecodingOptions, *, split: bool) -> Prepared:
        return self.preprocessor(DescribeRequest(tuple(images), options, split))

    def encode(self, prepared: Prepared) -> Encoded:
        return self.vision(prepared)

    def generate(self, encoded: Encoded, options: DecodingOptions, on_text: Callable[[str], None] | None = None) -> str:
        return self.text(dataclasses.replace(encoded, options=options), on_text).text

    def describe(self, images: Sequence["Image.Image"], options: DecodingOptions, *, split: bool) -> str:
        return self.generate(self.encode(self.preprocess(images, options, split=split)), options)


# Stage factories, called in worker processes as factory(model_dir, runtime).


def preprocess_stage(model_dir: str, runtime: RuntimeOptions) -> Preprocessor:
    return Preprocessor(Path(model_dir))


def vision_stage(model_dir: str, runtime: RuntimeOptions) -> VisionEncoder:
    return VisionEncoder(load_weights(Path(model_dir), runtime, parts=("vision",)), Path(model_dir))


def text_stage(model_dir: str, runtime: RuntimeOptions) -> TextDecoder:
    return TextDecoder(load_weights(Path(model_dir), runtime, parts=("text",)), Path(model_dir))
