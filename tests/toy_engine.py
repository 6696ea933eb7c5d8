"""A third engine built on the kit, in tests only: what the next family costs.

A toy vision-language model: each picture resized to 32 x 32, cut into sixteen 8 x 8 patches, each
patch projected to the text width by one linear (its "vision tower"); the text side is the kit's
tower, token loop and text stage unchanged. Registered through the ``ffai.engines`` entry point
(``minimal_engine.register_engine``) and run end to end by tests/test_toy_engine.py. Everything
below is the family's architecture: config fields, vision, prompt template, weight names,
preprocessing geometry; the rest is the kit's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ffai.engines.contract import DecodingOptions, EngineInfo, Request, StageSpec
from ffai.errors import UsageError
from ffai.kit.config_json import CheckpointConfig, JsonSection
from ffai.kit.stages import Encoded, EngineStages, stage_specs
from ffai.kit.text_config import TextConfig, read_text_config
from ffai.kit.tokenizing import ChatPrompts
from ffai.kit.weight_names import WeightNames, decoder_names

NAME, SIDE, PATCH = "toy", 32, 8
TOKENS_PER_PICTURE = (SIDE // PATCH) ** 2
IMAGE = "<image>"
NAMES = WeightNames({"vision.proj.*": "vision.proj.*", **decoder_names("model.")})


@dataclass(frozen=True)
class ToyConfig(CheckpointConfig):
    text: TextConfig
    image_token_id: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_section(cls, s: JsonSection) -> ToyConfig:
        text = s.section("text_config")
        return cls(read_text_config(text, {}, rope_theta=text.get("rope_theta", float)), s.get("image_token_id", int))


class Prompts(ChatPrompts):
    def build(self, pictures: int, question: str) -> list[int]:
        rendered = self.render([{"type": "image"}] * pictures, question)
        return self.encode(rendered.replace(IMAGE, IMAGE * TOKENS_PER_PICTURE))


def toy_model(cfg: ToyConfig, parts):
    """The toy's model: a patch projection, the kit's text tower, and how the two meet."""
    import torch
    from torch import nn

    from ffai.kit.generate import Prompt
    from ffai.kit.linears import Linear
    from ffai.kit.text_tower import TextModel

    class Vision(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = Linear(3 * PATCH * PATCH, cfg.text.hidden_size)

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # (n, 3, SIDE, SIDE) uint8
            x = pixels.float().div(255).unfold(2, PATCH, PATCH).unfold(3, PATCH, PATCH)  # (n, 3, 4, 4, 8, 8)
            return self.proj(x.permute(0, 2, 3, 1, 4, 5).reshape(-1, 3 * PATCH * PATCH))  # (n * 16, D)

    class ToyVLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            held = parts or ("vision", "text")
            self.vision = Vision() if "vision" in held else None
            self.text = TextModel(cfg.text, cfg.tie_word_embeddings) if "text" in held else None

        def prompt(self, encoded: Encoded) -> Prompt:
            ids = torch.tensor([encoded.input_ids])
            x = self.text.embed(ids)
            return Prompt(x.masked_scatter((ids == cfg.image_token_id)[..., None], encoded.visual.to(x.dtype)))

    return ToyVLM()


def precision(dtype: str, device: str = "cpu"):
    from ffai.kit.linear_kinds import INT8
    from ffai.kit.precision import Machine

    return Machine.of(dtype, device).plan(((r"text\.", INT8),) if dtype == "int8" else ())


def preprocessor(model_dir: Path):
    """Stage 1: each picture resized to SIDE x SIDE uint8, and the prompt's ids."""
    prompts = Prompts.from_dir(model_dir)

    def preprocess(request: Request) -> Encoded:
        import torch

        from ffai.kit.pictures import resize_tensor, rgb_tensor

        pixels = torch.cat([resize_tensor(rgb_tensor(image), (SIDE, SIDE), 3) for image in request.images])
        return Encoded(
            prompts.build(len(request.images), request.options.prompt or "Describe."), pixels, request.options
        )

    return preprocess


def vision_encoder(net, model_dir: Path):
    """Stage 2: the pictures' patches projected to the text width."""
    import torch

    def encode(pictures: Encoded) -> Encoded:
        with torch.inference_mode():
            return Encoded(pictures.input_ids, net.vision(pictures.visual), pictures.options)

    return encode


STAGES = EngineStages(
    NAMES, ToyConfig, Prompts, precision, preprocessor, vision_encoder, lambda cfg, parts, plan: toy_model(cfg, parts)
)


class ToyEngine:
    info = EngineInfo(NAME, "vlm", "experimental", "test only: a toy VLM on the kit", "toy-model")

    def check_window(self, model_dir: Path, frames: int, options: DecodingOptions) -> None:
        context = ToyConfig.from_dir(model_dir).text.max_position_embeddings
        if frames * TOKENS_PER_PICTURE + 16 + options.max_new_tokens > context:
            raise UsageError(f"--window {frames}: the toy model's context holds {context} tokens")

    def stages(self) -> tuple[StageSpec, ...]:
        return stage_specs(f"{__name__}:STAGES")


ENGINE = ToyEngine()


def write_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A random-weight toy checkpoint: its config, safetensors and a word-level tokenizer."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ffai.kit.loading import slots

    words = ["<end>", IMAGE, "User:", "Assistant:", *(f"w{i}" for i in range(60))]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<end>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<end>", IMAGE])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    template = "User:{% for c in messages[0]['content'] %}{% if c.type == 'image' %} <image>{% else %} {{ c.text }}{% endif %}{% endfor %} Assistant:"
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    text |= dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512, vocab_size=len(words))
    config = {"model_type": "toy_vlm", "image_token_id": 1, "text_config": text}
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = toy_model(ToyConfig.from_dir(folder), None)
    tensors = {  # each tensor as a checkpoint holds it: q, k, v (and gate, up) apart
        NAMES.checkpoint_name(target): torch.randn(slot.shape, generator=gen) * 0.3 + (1.0 if "norm" in target else 0.0)
        for target, slot in slots(model).items()
    }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder
