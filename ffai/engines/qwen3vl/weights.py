"""Where a Qwen3-VL checkpoint's tensors go in :class:`~ffai.engines.qwen3vl.model.Qwen3VL`: one table
of names (``NAMES``), read by the kit's loader (``ffai.kit.loading``), and the header-only check
the window check runs (:func:`check_checkpoint`).

Below ``model.visual`` the modules mirror transformers' own names; the text tower is the kit's,
under ``model.language_model`` (q/k/v and gate/up read into their rows of one fused weight each).
These are the hub checkpoints' names (the 4B's index lists them) and what transformers 5.24's
``Qwen3VLForConditionalGeneration.save_pretrained`` writes.
"""

from __future__ import annotations

from pathlib import Path

from ffai.kit.weight_names import WeightNames, decoder_names

NAMES = WeightNames({"model.visual.*": "visual.*", **decoder_names("model.language_model.")})


def check_checkpoint(model_dir: Path, cfg) -> None:
    """Every tensor the files (or the shard index) name is there with the config's shape, and
    every parameter has its tensor: headers only, nothing loaded (one ModelError line naming the
    file and the tensor otherwise)."""
    import torch

    from ffai.kit.loading import check_tensors

    from .model import Qwen3VL

    with torch.device("meta"):
        full = Qwen3VL(cfg)
    check_tensors(model_dir, full, NAMES, cfg.tie_word_embeddings)
