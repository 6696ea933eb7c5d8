"""Shared fixtures: random-weight SmolVLM checkpoints (cached on disk, see tests/checkpoints.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkpoints  # noqa: E402  (tests/ is not a package)


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    """A two-layer Idefics3 with 64 px tiles (16 image tokens each) and the real tokenizer."""
    return checkpoints.checkpoint("tiny")


@pytest.fixture(scope="session")
def real_checkpoint() -> Path:
    """SmolVLM-256M-Instruct shapes with random float32 weights (~1 GB, written once)."""
    return checkpoints.checkpoint("real")


@pytest.fixture(scope="session")
def reference_loader():
    """``load(checkpoint) -> (transformers model, processor)``, each loaded once per session."""

    def load(path: Path):
        return checkpoints.reference_model(path), checkpoints.reference_processor(path)

    return load
