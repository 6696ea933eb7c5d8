"""SmolVLM configuration, read from the checkpoint's own ``config.json``: both generations,
``model_type`` ``idefics3`` (SmolVLM) and ``smolvlm`` (SmolVLM2), which are the same towers.

Follows transformers' ``Idefics3Config`` / ``Idefics3VisionConfig`` / ``LlamaConfig`` (the text
tower is the kit's, ``ffai.kit.text_config.TextConfig``; and
``SmolVLMConfig`` / ``SmolVLMVisionConfig``, subclasses with the same defaults): a key the
reference treats as required must be present; a key the reference defaults takes the reference's
default (never a SmolVLM-256M value). Both config.json layouts are accepted: the hub's
transformers-4.46 one (``text_config.rope_theta``) and the one transformers 5.x writes
(``text_config.rope_parameters = {"rope_type": "default", "rope_theta": ...}``).
Features this port does not implement (rope scaling, other activations) are refused here rather
than silently computed wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from ffai.errors import ModelError
from ffai.kit.config_json import CheckpointConfig, JsonSection
from ffai.kit.text_config import TextConfig, read_text_config
from ffai.kit.vision_config import VisionTowerConfig

# config.json's model_type -> the processor class its checkpoint's files name (processor_class):
# SmolVLM2's processor adds video, and the two generations' files must never be mixed.
PROCESSORS = {"idefics3": "Idefics3Processor", "smolvlm": "SmolVLMProcessor"}


# The keys Idefics3VisionConfig names otherwise than the kit, and its defaults for what a file leaves out.
VISION_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads"}
VISION_DEFAULTS = {"intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3}


@dataclass(frozen=True)
class VisionConfig(VisionTowerConfig):
    """SigLIP-style vision tower (transformers' ``Idefics3VisionConfig``): the kit's sizes, its tile
    side and its LayerNorm's eps."""

    image_size: int
    layer_norm_eps: float

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side**2

    @classmethod
    def from_section(cls, s: JsonSection) -> "VisionConfig":
        sizes = cls.sizes(s, VISION_KEYS, VISION_DEFAULTS)
        cfg = cls(**sizes, image_size=s.positive("image_size"), layer_norm_eps=s.get("layer_norm_eps", float, 1e-6))
        s.check(cfg.image_size >= cfg.patch_size, "image_size must be at least patch_size")
        return cfg


# transformers' LlamaConfig defaults for what SmolVLM's files may leave out; every other size is required.
TEXT_DEFAULTS = {"max_position_embeddings": 2048}


def text_config(s: JsonSection) -> TextConfig:
    """The Llama text tower (transformers' ``LlamaConfig``), default RoPE only. Its own
    ``tie_word_embeddings`` is not read: Idefics3 ties the head by the top-level flag."""
    model_type = s.get("model_type", str, "llama")
    s.check(model_type == "llama", f"model_type {model_type!r} is not supported (llama)")
    return read_text_config(s, TEXT_DEFAULTS, rope_theta=_rope_theta(s))


@dataclass(frozen=True)
class ModelConfig(CheckpointConfig):
    """The whole Idefics3 model: vision tower, pixel-shuffle connector, text tower. ``model_type``
    is the generation (a key of ``PROCESSORS``)."""

    model_type: str
    vision: VisionConfig
    text: TextConfig
    scale_factor: int
    image_token_id: int
    tie_word_embeddings: bool

    @property
    def image_seq_len(self) -> int:
        """Image tokens per tile: patches per tile over the pixel shuffle's scale factor squared."""
        return self.vision.num_patches // self.scale_factor**2

    @property
    def connector_in_features(self) -> int:
        return self.vision.hidden_size * self.scale_factor**2

    @classmethod
    def from_section(cls, s: JsonSection) -> "ModelConfig":
        model_type = s.get("model_type", str)
        if model_type not in PROCESSORS:
            expected = " or ".join(repr(t) for t in PROCESSORS)
            raise ModelError(f"{s.source}: model_type {model_type!r} is not supported (expected {expected})")
        vision = VisionConfig.from_section(s.section("vision_config"))
        text = text_config(s.section("text_config"))
        cfg = cls(
            model_type=model_type,
            vision=vision,
            text=text,
            scale_factor=s.positive("scale_factor"),
            image_token_id=s.get("image_token_id", int),
            # Idefics3ForConditionalGeneration ties lm_head by the top-level flag.
            tie_word_embeddings=s.get("tie_word_embeddings", bool, False),
        )
        s.check(vision.patches_per_side % cfg.scale_factor == 0, "patches per side must divide by scale_factor")
        s.check(0 <= cfg.image_token_id < text.vocab_size, "image_token_id must be inside the text vocabulary")
        return cfg


def _rope_theta(s: JsonSection) -> float:
    """rope_theta from either config layout; anything but plain RoPE is refused."""
    params = s.data.get("rope_parameters")
    if params is not None:
        p = s.section("rope_parameters")
        rope_type = p.get("rope_type", str, "default")
        s.check(rope_type == "default", f"rope_parameters.rope_type {rope_type!r} is not supported")
        return p.get("rope_theta", float)
    scaling = s.data.get("rope_scaling")
    s.check(scaling is None, f"rope_scaling {scaling!r} is not supported")
    return s.get("rope_theta", float)
