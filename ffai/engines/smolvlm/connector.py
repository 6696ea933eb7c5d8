"""The Idefics3 connector: pixel shuffle, then a bias-free linear projection to the text width.

Follows transformers' ``Idefics3Connector`` / ``Idefics3SimpleMLP``. The pixel shuffle trades
sequence length for width: each ``scale x scale`` block of patch features becomes one token, in
exactly the reference's element order (the projection weights depend on it).
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """(N, S, D) with S = side² -> (N, S / scale², D * scale²)."""
    n, seq, d = x.shape
    side = int(seq**0.5)
    x = x.view(n, side, side // scale, d * scale)  # (N, rows, cols/s, D*s): merge s neighbours in a row
    x = x.permute(0, 2, 1, 3)  # (N, cols/s, rows, D*s)
    x = x.reshape(n, side // scale, side // scale, d * scale**2)  # (N, cols/s, rows/s, D*s²)
    x = x.permute(0, 2, 1, 3)  # (N, rows/s, cols/s, D*s²)
    return x.reshape(n, seq // scale**2, d * scale**2)  # (N, S/s², D*s²)


class ModalityProjection(nn.Module):
    """Follows transformers' ``Idefics3SimpleMLP`` (one linear layer, named ``proj``)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Connector(nn.Module):
    """(N, S, vision D) patch features -> (N, image_seq_len, text D) image token embeddings."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.scale = cfg.scale_factor
        self.modality_projection = ModalityProjection(cfg.connector_in_features, cfg.text.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.modality_projection(pixel_shuffle(x, self.scale))
