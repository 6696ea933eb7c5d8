"""Qwen3-VL configuration, read from the checkpoint's own ``config.json`` (``model_type: qwen3_vl``).

Follows transformers' ``Qwen3VLConfig`` / ``Qwen3VLVisionConfig`` / ``Qwen3VLTextConfig``: a key the
reference defaults takes the reference's default (never a 2B value); the sizes that decide the
towers' shapes are required. Both layouts of the text tower's RoPE are accepted: the hub's
(``rope_theta`` beside ``rope_scaling = {mrope_section, mrope_interleaved, rope_type}``) and the one
transformers 5.x writes (all four in ``rope_parameters``). What this port does not compute (another
rope type, another activation) is refused here rather than computed wrong. Every error is one line
naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from ffai.kit.config_json import CheckpointConfig, JsonSection
from ffai.kit.text_config import TextConfig, read_text_config
from ffai.kit.vision_config import VisionTowerConfig

MODEL_TYPE = "qwen3_vl"


# The keys Qwen3VLVisionConfig names otherwise than the kit, and its defaults (every size has one).
VISION_KEYS = {"num_layers": "depth", "num_channels": "in_channels"}
VISION_DEFAULTS = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3}
VISION_DEFAULTS |= {"patch_size": 16}


@dataclass(frozen=True)
class VisionConfig(VisionTowerConfig):
    """The vision tower (transformers' ``Qwen3VLVisionConfig``): the kit's sizes, and its video
    patches, patch merging, position table, DeepStack layers and rotary theta."""

    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    rope_theta: float

    @property
    def grid_side(self) -> int:
        """Side of the square table of learned position embeddings."""
        return int(self.num_position_embeddings**0.5)

    @property
    def merge_unit(self) -> int:
        """Patches merged into one token."""
        return self.spatial_merge_size**2

    @property
    def patch_values(self) -> int:
        """Values in one flattened patch (the processor's row of ``pixel_values``)."""
        return self.num_channels * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_section(cls, s: JsonSection) -> "VisionConfig":
        rope = s.data.get("rope_parameters")
        theta = 10000.0  # the reference's default for its axial rope
        if rope is not None:
            r = s.section("rope_parameters")
            rope_type = r.get("rope_type", str, "axial")
            r.check(rope_type == "axial", f"rope_type {rope_type!r} is not supported (axial)")
            theta = r.get("rope_theta", float, theta)
        cfg = cls(
            **cls.sizes(s, VISION_KEYS, VISION_DEFAULTS),
            temporal_patch_size=s.positive("temporal_patch_size", 2),
            spatial_merge_size=s.positive("spatial_merge_size", 2),
            out_hidden_size=s.positive("out_hidden_size", 3584),
            num_position_embeddings=s.positive("num_position_embeddings", 2304),
            deepstack_visual_indexes=s.ints("deepstack_visual_indexes", [8, 16, 24]),
            rope_theta=theta,
        )
        s.check(cfg.head_dim % 4 == 0, "head_dim (hidden_size / num_heads) must divide by 4 for the 2D rotary")
        s.check(cfg.grid_side**2 == cfg.num_position_embeddings, "num_position_embeddings must be a square")
        s.check(
            all(i < cfg.num_layers for i in cfg.deepstack_visual_indexes),
            "deepstack_visual_indexes must be below depth",
        )
        return cfg


# transformers' Qwen3VLTextConfig defaults, for what a checkpoint's text_config leaves out.
TEXT_DEFAULTS = {
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 128000,
    "vocab_size": 151936,
}


def text_config(s: JsonSection) -> tuple[TextConfig, tuple[int, int, int]]:
    """The Qwen3 text tower with multimodal RoPE (transformers' ``Qwen3VLTextConfig``): the kit's
    tower with q and k normalised per head, and the RoPE's (t, h, w) sections."""
    theta, section = _text_rope(s)
    cfg = read_text_config(s, TEXT_DEFAULTS, rope_theta=theta, qk_norm=True)
    s.check(
        sum(section) == cfg.head_dim // 2,
        f"mrope_section {list(section)} must add up to head_dim / 2 = {cfg.head_dim // 2}",
    )
    return cfg, section


def _text_rope(s: JsonSection) -> tuple[float, tuple[int, int, int]]:
    """(rope_theta, mrope_section) from either layout; anything but interleaved default mRoPE is refused."""
    if s.data.get("rope_parameters") is not None:
        r, theta_from = s.section("rope_parameters"), s.section("rope_parameters")
    else:
        r, theta_from = s.section("rope_scaling"), s
    rope_type = r.get("rope_type", str, "default")
    r.check(rope_type == "default", f"rope_type {rope_type!r} is not supported (default)")
    # transformers' Qwen3-VL always interleaves; a checkpoint saying otherwise was made for another layout.
    r.check(r.get("mrope_interleaved", bool, True), "mrope_interleaved false is not supported (Qwen3-VL interleaves)")
    section = r.ints("mrope_section", [24, 20, 20])
    r.check(len(section) == 3, f"mrope_section must have 3 entries (t, h, w), found {list(section)}")
    return theta_from.get("rope_theta", float, 500000.0), (section[0], section[1], section[2])


@dataclass(frozen=True)
class ModelConfig(CheckpointConfig):
    """The whole model: vision tower (with its mergers), text tower, the vision special tokens."""

    vision: VisionConfig
    text: TextConfig
    mrope_section: tuple[int, int, int]  # the text tower's RoPE frequencies from the (t, h, w) rows
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    tie_word_embeddings: bool

    @classmethod
    def from_section(cls, s: JsonSection) -> "ModelConfig":
        model_type = s.get("model_type", str)
        s.check(model_type == MODEL_TYPE, f"model_type {model_type!r} is not a Qwen3-VL checkpoint ({MODEL_TYPE!r})")
        vision = VisionConfig.from_section(s.section("vision_config"))
        text, section = text_config(s.section("text_config"))
        cfg = cls(
            vision=vision,
            text=text,
            mrope_section=section,
            image_token_id=s.get("image_token_id", int, 151655),
            video_token_id=s.get("video_token_id", int, 151656),
            vision_start_token_id=s.get("vision_start_token_id", int, 151652),
            vision_end_token_id=s.get("vision_end_token_id", int, 151653),
            tie_word_embeddings=s.get("tie_word_embeddings", bool, False),
        )
        s.check(
            vision.out_hidden_size == text.hidden_size,
            f"vision_config.out_hidden_size {vision.out_hidden_size} must equal text_config.hidden_size "
            f"{text.hidden_size}",
        )
        s.check(
            len(vision.deepstack_visual_indexes) <= text.num_hidden_layers,
            "more deepstack_visual_indexes than text layers",
        )
        for key in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
            s.check(0 <= getattr(cfg, key) < text.vocab_size, f"{key} must be inside the text vocabulary")
        return cfg
