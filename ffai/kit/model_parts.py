"""An engine's model as held by one worker: some of its parts, never all by necessity. The pipeline's
vision worker needs no text tower and its text worker no vision tower, so an absent part is None
and costs no memory, and a call that needs it says so in one line."""

from __future__ import annotations

import torch
from torch import nn

from ffai.errors import EngineError
from ffai.kit.stages import PARTS


class PartedModel(nn.Module):
    """The base of an engine's model: ``parts`` (None: all of ``PARTS``) checked and kept in order."""

    def __init__(self, parts: tuple[str, ...] | None = None) -> None:
        super().__init__()
        parts = PARTS if parts is None else parts
        unknown = set(parts) - set(PARTS)
        if unknown or not parts:
            raise ValueError(f"parts must be a non-empty subset of {PARTS}, got {parts!r}")
        self.parts = tuple(p for p in PARTS if p in parts)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _require(self, part: str) -> None:
        if part not in self.parts:
            raise EngineError(f"this model was loaded without its {part} part (parts={self.parts})")
