"""The engine object behind the ``smolvlm`` entry point, and the loaded model's three stages.

preprocess (Pillow → tiles + prompt ids) → encode (vision tower + connector) → generate
(text tower with a static KV cache). ``describe`` chains them for direct library use; the
worker pipeline runs them as separate stages. Nothing here knows about processes or the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ffai.engine import DecodingOptions, EngineInfo, RuntimeOptions
from ffai.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image

INFO = EngineInfo(
    name="smolvlm",
    task="vlm",
    status="experimental",
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
    pixel_values: "torch.Tensor"  # (n_tiles, 3, tile, tile)
    pixel_attention_mask: "torch.Tensor"  # (n_tiles, tile, tile) bool


@dataclass
class Encoded:
    """Output of the vision stage: prompt ids and the image embeddings to merge into them."""

    input_ids: list[int]
    image_embeds: "torch.Tensor"  # (n_tiles, image_seq_len, text hidden)


class SmolVLMEngine:
    info = INFO

    def check_window(self, model_dir: Path, n_images: int, options: DecodingOptions, *, split: bool) -> None:
        from ffai_smolvlm.config import ModelConfig
        from ffai_smolvlm.preprocess import ProcessorConfig
        from ffai_smolvlm.prompt import PromptBuilder

        config = ModelConfig.from_dir(model_dir)
        processor = ProcessorConfig.from_dir(model_dir)
        builder = PromptBuilder.from_dir(model_dir)
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


ENGINE = SmolVLMEngine()


def _torch_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    return name


class SmolVLMModel:
    """A checkpoint in memory. Weights are memory-mapped from safetensors on construction."""

    def __init__(self, model_dir: Path, runtime: RuntimeOptions) -> None:
        import torch

        from ffai_smolvlm.preprocess import ProcessorConfig
        from ffai_smolvlm.prompt import PromptBuilder
        from ffai_smolvlm.weights import load_model

        if runtime.threads is not None:
            torch.set_num_threads(runtime.threads)
        self.device = _torch_device(runtime.device)
        self.dtype = getattr(torch, runtime.dtype)
        self.processor = ProcessorConfig.from_dir(model_dir)
        self.prompts = PromptBuilder.from_dir(model_dir)
        self.stop_ids = self.prompts.stop_ids()
        self.net = load_model(model_dir, dtype=self.dtype, device=self.device)

    def preprocess(self, images: Sequence["Image.Image"], options: DecodingOptions, *, split: bool) -> Prepared:
        from ffai_smolvlm.preprocess import preprocess_images

        batch = preprocess_images(images, self.processor, split=split)
        text = prompt_text(options, len(images), split)
        ids = self.prompts.build(batch.grids, text, self.processor.image_seq_len)
        return Prepared(ids, batch.pixel_values, batch.pixel_attention_mask)

    def encode(self, prepared: Prepared) -> Encoded:
        import torch

        with torch.inference_mode():
            pixels = prepared.pixel_values.to(self.device, self.dtype)
            mask = prepared.pixel_attention_mask.to(self.device)
            embeds = self.net.encode_images(pixels, mask)
        return Encoded(prepared.input_ids, embeds)

    def generate(
        self, encoded: Encoded, options: DecodingOptions, on_token: Callable[[str], None] | None = None
    ) -> str:
        return self.prompts.decode(self.generate_ids(encoded, options, on_token))

    def generate_ids(
        self, encoded: Encoded, options: DecodingOptions, on_token: Callable[[str], None] | None = None
    ) -> list[int]:
        import torch

        from ffai_smolvlm.generate import generate

        token_cb: Callable[[int], Any] | None = None
        if on_token is not None:
            token_cb = lambda token_id: on_token(self.prompts.decode([token_id]))  # noqa: E731
        ids = torch.tensor([encoded.input_ids], device=self.device)
        with torch.inference_mode():
            return generate(
                self.net,
                ids,
                encoded.image_embeds,
                max_new_tokens=options.max_new_tokens,
                stop_ids=self.stop_ids,
                force_new_tokens=options.force_new_tokens,
                temperature=options.temperature,
                top_p=options.top_p,
                top_k=options.top_k,
                seed=options.seed,
                on_token=token_cb,
            )

    def describe(self, images: Sequence["Image.Image"], options: DecodingOptions, *, split: bool) -> str:
        return self.generate(self.encode(self.preprocess(images, options, split=split)), options)
