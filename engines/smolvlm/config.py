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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ffai.errors import ModelError

CONFIG_FILE = "config.json"
# config.json's model_type -> the processor class its checkpoint's files name (processor_class):
# SmolVLM2's processor adds video, and the two generations' files must never be mixed.
PROCESSORS = {"idefics3": "Idefics3Processor", "smolvlm": "SmolVLMProcessor"}
VISION_ACTS = ("gelu_pytorch_tanh",)
TEXT_ACTS = ("silu",)
_MISSING = object()


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a file of the model folder holding its ``what``), or a
    one-line ModelError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ModelError(f"{path}: no {path.name} in the model folder") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: cannot read {what}: {e}") from e
    if not isinstance(data, dict):
        raise ModelError(f"{path}: {what} must be a JSON object")
    return data


class _Section:
    """Typed reads from one dict of config.json, with errors naming the file and the key path."""

    def __init__(self, data: Any, source: str, prefix: str) -> None:
        if not isinstance(data, dict):
            raise ModelError(f"{source}: {prefix.rstrip('.') or 'config'} must be a JSON object")
        self.data, self.source, self.prefix = data, source, prefix

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise ModelError(f"{self.source}: missing required key {self.prefix}{key}")
            return default
        return self._typed(key, value, kind)

    def _typed(self, key: str, value: Any, kind: type) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ModelError(f"{self.source}: {self.prefix}{key} must be {kind.__name__}, found {value!r}")
        return value

    def positive(self, key: str, default: Any = _MISSING) -> int:
        value = self.get(key, int, default)
        if value < 1:
            raise ModelError(f"{self.source}: {self.prefix}{key} must be >= 1, found {value}")
        return value

    def section(self, key: str) -> "_Section":
        return _Section(self.get(key, dict), self.source, f"{self.prefix}{key}.")


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
    def from_section(cls, s: _Section) -> "VisionConfig":
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
        _check(s, cfg.hidden_size % cfg.num_attention_heads == 0, "hidden_size must divide by num_attention_heads")
        _check(s, cfg.image_size >= cfg.patch_size, "image_size must be at least patch_size")
        _check(s, cfg.hidden_act in VISION_ACTS, f"hidden_act {cfg.hidden_act!r} is not supported ({VISION_ACTS})")
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
    def from_section(cls, s: _Section) -> "TextConfig":
        model_type = s.get("model_type", str, "llama")
        _check(s, model_type == "llama", f"model_type {model_type!r} is not supported (llama)")
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
        _check(s, heads % cfg.num_key_value_heads == 0, "num_attention_heads must divide by num_key_value_heads")
        _check(s, cfg.hidden_act in TEXT_ACTS, f"hidden_act {cfg.hidden_act!r} is not supported ({TEXT_ACTS})")
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
        s = _Section(data, source, "")
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
        _check(s, vision.patches_per_side % cfg.scale_factor == 0, "patches per side must divide by scale_factor")
        _check(s, 0 <= cfg.image_token_id < text.vocab_size, "image_token_id must be inside the text vocabulary")
        return cfg


def _rope_theta(s: _Section) -> float:
    """rope_theta from either config layout; anything but plain RoPE is refused."""
    params = s.data.get("rope_parameters")
    if params is not None:
        p = s.section("rope_parameters")
        rope_type = p.get("rope_type", str, "default")
        _check(s, rope_type == "default", f"rope_parameters.rope_type {rope_type!r} is not supported")
        return p.get("rope_theta", float)
    scaling = s.data.get("rope_scaling")
    _check(s, scaling is None, f"rope_scaling {scaling!r} is not supported")
    return s.get("rope_theta", float)


def _check(s: _Section, ok: bool, message: str) -> None:
    if not ok:
        where = s.prefix.rstrip(".")
        raise ModelError(f"{s.source}: {where + ': ' if where else ''}{message}")
