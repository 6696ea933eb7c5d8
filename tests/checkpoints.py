"""Random-weight test checkpoints, written once and cached, plus the transformers reference.

A checkpoint lives in ``<repo>/.cache/checkpoints/<kind>-<key>/``, keyed and placed as the
bench places its default checkpoint (``ffai.bench.cases.checkpoint_key`` /
``place_atomically``): a change to the writer script, its config, the seed, the dtype or the
transformers version writes a fresh one; an aborted run leaves no half checkpoint, and of two
parallel writers the second simply discards its copy.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ffai.bench import cases

REPO = cases.REPO
CACHE = cases.CHECKPOINT_CACHE


writer = cases.checkpoint_writer  # scripts/make_checkpoint.py as a module


def checkpoint(kind: str, seed: int = 0, dtype: str = "float32") -> Path:
    """The cached checkpoint folder for ``kind``, written first if absent."""
    final = CACHE / f"{kind}-{cases.checkpoint_key(kind, seed, dtype)}"
    if final.is_dir():
        return final
    return cases.place_atomically(final, lambda tmp: writer().write_checkpoint(kind, tmp, seed=seed, dtype=dtype))


@functools.cache
def reference_model(path: Path, dtype: str = "float32", attention: str | None = None):
    """transformers' Idefics3ForConditionalGeneration on a checkpoint, loaded once per session.
    ``attention`` picks transformers' attention implementation (default: its own choice, SDPA)."""
    import torch
    from transformers import Idefics3ForConditionalGeneration

    extra = {"attn_implementation": attention} if attention else {}
    return Idefics3ForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, dtype), **extra).eval()


@functools.cache
def reference_processor(path: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)
