"""The text tower's configuration (``ffai.kit.text_tower``), read by each engine from its checkpoint's
config.json. No torch: an engine's cheap checks read it before any weight loads."""

from __future__ import annotations

from dataclasses import dataclass

from ffai.kit.config_json import JsonSection

ACTIVATIONS = ("silu",)


@dataclass(frozen=True)
class TextConfig:
    """The text tower's sizes, read by each engine from its checkpoint (:func:`read_text_config`)."""

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
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # q and k RMS-normalised per head before RoPE (Qwen3)

    def weights(self, tied_head: bool) -> int:
        """How many weights the tower and its LM head hold: the decode floor's numerator (a step
        reads one row of the embedding table, so the floor is a loose one)."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        attention += (q + 2 * kv + self.hidden_size) if self.attention_bias else 0
        attention += 2 * self.head_dim if self.qk_norm else 0
        mlp = 3 * self.hidden_size * self.intermediate_size
        mlp += (2 * self.intermediate_size + self.hidden_size) if self.mlp_bias else 0
        layer = attention + mlp + 2 * self.hidden_size  # two RMSNorm weights
        table = self.vocab_size * self.hidden_size
        return table + self.num_hidden_layers * layer + self.hidden_size + (0 if tied_head else table)


_REQUIRED = object()


def read_text_config(s: JsonSection, defaults: dict, *, rope_theta: float, qk_norm: bool = False) -> TextConfig:
    """A :class:`TextConfig` from a checkpoint's text section ``s``; a key missing from it takes
    ``defaults``' value (the engine's reference's defaults; a key absent there is required).
    The engine reads RoPE itself (its layouts and kinds are its own) and gives its theta."""

    def get(key: str, kind: type = int):
        default = defaults.get(key, _REQUIRED)
        if kind is int:
            return s.positive(key) if default is _REQUIRED else s.positive(key, default)
        return s.get(key, kind) if default is _REQUIRED else s.get(key, kind, default)

    heads, hidden = get("num_attention_heads"), get("hidden_size")
    cfg = TextConfig(
        hidden_size=hidden,
        intermediate_size=get("intermediate_size"),
        num_hidden_layers=get("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=s.positive("num_key_value_heads", heads),
        head_dim=s.positive("head_dim", defaults.get("head_dim", hidden // heads)),
        rms_norm_eps=get("rms_norm_eps", float),
        rope_theta=rope_theta,
        max_position_embeddings=get("max_position_embeddings"),
        vocab_size=get("vocab_size"),
        attention_bias=s.get("attention_bias", bool, False),
        mlp_bias=s.get("mlp_bias", bool, False),
        qk_norm=qk_norm,
    )
    act = s.get("hidden_act", str, "silu")
    s.check(act in ACTIVATIONS, f"hidden_act {act!r} is not supported ({ACTIVATIONS})")
    s.check(heads % cfg.num_key_value_heads == 0, "num_attention_heads must divide by num_key_value_heads")
    s.check(cfg.head_dim % 2 == 0, "head_dim must be even")
    return cfg
