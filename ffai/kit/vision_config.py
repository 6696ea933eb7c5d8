"""The sizes every engine's vision transformer has, read from its checkpoint's vision section: the
common part of an engine's vision config (its own fields, patch merging or tiles, are its own).
No torch: an engine's cheap checks read it before any weight loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ffai.kit.config_json import JsonSection

GELU_TANH = "gelu_pytorch_tanh"  # the activation every vision tower here computes
_REQUIRED = object()


@dataclass(frozen=True)
class VisionTowerConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_channels: int
    patch_size: int
    hidden_act: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @staticmethod
    def sizes(s: JsonSection, keys: dict[str, str], defaults: dict[str, Any]) -> dict[str, Any]:
        """The common fields from the vision section ``s``: each read from its own key or the one
        ``keys`` maps it to (the engine's reference names it), a missing key taking ``defaults``'
        value for that key (the reference's default; absent there: required). Checked: the width
        divides by the heads, the activation is tanh-approximated GELU."""
        found: dict[str, Any] = {}
        for field in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_channels", "patch_size"):
            key = keys.get(field, field)
            default = defaults.get(key, _REQUIRED)
            found[field] = s.positive(key) if default is _REQUIRED else s.positive(key, default)
        found["hidden_act"] = s.get("hidden_act", str, GELU_TANH)
        heads = keys.get("num_heads", "num_heads")
        s.check(found["hidden_size"] % found["num_heads"] == 0, f"hidden_size must divide by {heads}")
        s.check(found["hidden_act"] == GELU_TANH, f"hidden_act {found['hidden_act']!r} is not supported ({GELU_TANH})")
        return found
