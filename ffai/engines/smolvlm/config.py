"""SmolVLM configuration, read from the checkpoint's own ``config.json``: both generations,
``model_type`` ``idefics3`` (SmolVLM) and ``smolvlm`` (SmolVLM2), which are the same towers.

Follows transformers' ``Idefics3Config`` / ``Idefics3VisionConfig`` / ``LlamaConfig`` (and
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
from pathlib import Path

from ffai.errors import ModelError
from ffai.kit.config_json import JsonSection, read_json_object

CONFIG_FILE = "config.json"
# config.json's model_type -> the processor class its checkpoint's files name (processor_class):
# SmolVLM2's processor adds video, and the two generations' files must never be mixed.
PROCESSORS = {"idefics3": "Idefics3Processor", "smolvlm": "SmolVLMProcessor"}
VISION_ACTS = ("gelu_pytorch_tanh",)
TEXT_ACTS = ("silu",)


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP-style vision tower (transformers' ``Idefics3VisionConfig``)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    patch_size: int
    image_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side**2

    @classmethod
    def from_section(cls, s: JsonSection) -> "VisionConfig":
        cfg = cls(
            hidden_size=s.positive("hidden_size"),
            # The reference's defaults (Idefics3VisionConfig): SmolVLM2-500M's file leaves both out.
            intermediate_size=s.positive("intermediate_size", 3072),
            num_hidden_layers=s.positive("num_hidden_layers", 12),
            num_attention_heads=s.positive("num_attention_heads"),
            patch_size=s.positive("patch_size"),
            image_size=s.positive("image_size"),
            num_channels=s.positive("num_channels", 3),
            layer_norm_eps=s.get("layer_norm_eps", float, 1e-6),
            hidden_act=s.get("hidden_act", str, "gelu_pytorch_tanh"),
        )
        s.check(cfg.hidden_size % cfg.num_attention_heads == 0, "hidden_size must divide by num_attention_heads")
        s.check(cfg.image_size >= cfg.patch_size, "image_size must be at least patch_size")
        s.check(cfg.hidden_act in VISION_ACTS, f"hidden_act {cfg.hidden_act!r} is not supported ({VISION_ACTS})")
        return cfg


@dataclass(frozen=True)
class TextConfig:
    """Llama text tower (transformers' ``LlamaConfig``), default RoPE only. Its own
    ``tie_word_embeddings`` is not read: Idefics3 ties the head by the top-level flag."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    hidden_act: str
    attention_bias: bool
    mlp_bias: bool

    @classmethod
    def from_section(cls, s: JsonSection) -> "TextConfig":
        model_type = s.get("model_type", str, "llama")
        s.check(model_type == "llama", f"model_type {model_type!r} is not supported (llama)")
        heads = s.positive("num_attention_heads")
        hidden = s.positive("hidden_size")
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=s.positive("intermediate_size"),
            num_hidden_layers=s.positive("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=s.positive("num_key_value_heads", heads),
            head_dim=s.positive("head_dim", hidden // heads),
            rms_norm_eps=s.get("rms_norm_eps", float),
            rope_theta=_rope_theta(s),
            max_position_embeddings=s.positive("max_position_embeddings", 2048),
            vocab_size=s.positive("vocab_size"),
            hidden_act=s.get("hidden_act", str, "silu"),
            attention_bias=s.get("attention_bias", bool, False),
            mlp_bias=s.get("mlp_bias", bool, False),
        )
        s.check(heads % cfg.num_key_value_heads == 0, "num_attention_heads must divide by num_key_value_heads")
        s.check(cfg.hidden_act in TEXT_ACTS, f"hidden_act {cfg.hidden_act!r} is not supported ({TEXT_ACTS})")
        return cfg


@dataclass(frozen=True)
class ModelConfig:
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
    def from_dir(cls, model_dir: Path | str) -> "ModelConfig":
        path = Path(model_dir) / CONFIG_FILE
        return cls.from_dict(read_json_object(path, "config"), source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = CONFIG_FILE) -> "ModelConfig":
        s = JsonSection(data, source, "")
        model_type = s.get("model_type", str)
        if model_type not in PROCESSORS:
            expected = " or ".join(repr(t) for t in PROCESSORS)
            raise ModelError(f"{source}: model_type {model_type!r} is not supported (expected {expected})")
        vision = VisionConfig.from_section(s.section("vision_config"))
        text = TextConfig.from_section(s.section("text_config"))
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
