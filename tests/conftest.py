"""Shared fixtures: random-weight SmolVLM checkpoints, cached on disk, and the transformers
reference on them (ffai.bench.checkpoints caches what ffai_smolvlm.bench writes). Helper
modules beside the tests (media_fixtures, hub_server) import by name: pyproject's pytest
``pythonpath`` lists tests/."""

from __future__ import annotations

from pathlib import Path

import pytest

from ffai.bench import checkpoints
from ffai_smolvlm.bench.checkpoints import reference_model, reference_processor


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
        return reference_model(path), reference_processor(path)

    return load


@pytest.fixture(autouse=True, scope="session")
def terminal_width():
    """One terminal width for every test, in this process and in the subprocesses that inherit
    its environment: rich and typer wrap help, tables and errors at the width, and a wrapped
    line would split what the tests look for."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "200")
        yield
