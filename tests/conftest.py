"""Shared fixtures: random-weight SmolVLM checkpoints and Qwen3-VL's tiny one, cached on disk, and
the transformers reference on SmolVLM's (ffai.bench.checkpoints caches what ffai.engines.smolvlm.bench
writes); the gate on ``browser`` tests (skipped without chromium, required under ``CI=true``).
Helper modules beside the tests (media_fixtures, hub_server) import by name: pyproject's pytest
``pythonpath`` lists tests/."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from ffai.bench import checkpoints
from ffai.engines.smolvlm.bench.checkpoints import WRITER

# Started from a shell's background job (`bash .ci/run &` without job control), this process has
# SIGINT ignored, and so would every ffai it starts: the Ctrl-C tests need it delivered.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    """A two-layer Idefics3 with 64 px tiles (16 image tokens each) and the real tokenizer."""
    return checkpoints.checkpoint("tiny")


@pytest.fixture(scope="session")
def real_checkpoint() -> Path:
    """SmolVLM-256M-Instruct shapes with random float32 weights (~1 GB, written once)."""
    return checkpoints.checkpoint("real")


@pytest.fixture(scope="session")
def qwen3vl_tiny() -> Path:
    """Qwen3-VL's tiny random-weight checkpoint (4 vision blocks, 3 text layers) with the real
    tokenizer, chat template and processor files (``ffai.engines.qwen3vl.bench.checkpoints``)."""
    return checkpoints.checkpoint("tiny", "qwen3-vl")


@pytest.fixture(scope="session")
def reference_loader():
    """``load(checkpoint) -> (transformers model, processor)``, each loaded once per session."""

    def load(path: Path):
        return WRITER.reference_model(path), WRITER.reference_processor(path)

    return load


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of many small ops (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``):
    on a shared 2-core machine two threads spin-wait on each other and run 3-5x slower than one.
    Restored afterwards so other modules keep their setting."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def terminal_width():
    """One terminal width for every test, in this process and in the subprocesses that inherit
    its environment: rich and typer wrap help, tables and errors at the width, and a wrapped
    line would split what the tests look for."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "200")
        yield


def find_chromium() -> str | None:
    """The system's chromium (Debian's), which playwright drives: it never downloads a browser
    here. Looked up on PATH, so a test can hide it."""
    return shutil.which("chromium")


def require_chromium() -> str:
    """chromium's path; without it a browser test skips, naming the install command, except
    under ``CI=true``, where the browser tests are required and fail with the same line."""
    path = find_chromium()
    if path is None:
        reason = "no chromium on PATH: apt-get install chromium (or deselect with -m 'not browser')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Every ``browser`` test is gated here, before its fixtures (a caption run, the browser) start."""
    if item.get_closest_marker("browser") is not None:
        require_chromium()


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of the chromium the browser tests launch."""
    return require_chromium()
