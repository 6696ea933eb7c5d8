"""Helpers for the live-source tests: ``ffai caption`` run as a real subprocess whose output
lines are timed as they arrive, and a deliberately slow engine for the dropping tests.

The slow engine is the SmolVLM engine with a delay before each window's preprocessing, read
from ``SLOW_ENV`` by this module only. It is registered the way any plugin is, through an
entry point: ``register_slow_engine(folder)`` writes a ``*.dist-info`` with the entry point
into ``folder``, which ``ffai_env`` puts on the subprocess's PYTHONPATH beside tests/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ffai.engines.contract import EngineInfo, StageSpec
from ffai.engines.smolvlm.engine import ENGINE as SMOLVLM
from ffai.engines.smolvlm.stages import STAGES
from minimal_engine import register_engine

TESTS = Path(__file__).resolve().parent
SLOW_ENV = "FFAI_TEST_STAGE_DELAY_S"
SLOW_NAME = "slow-smolvlm"


def slow_preprocess_stage(model_dir: str, runtime):
    stage = STAGES.preprocess_stage(model_dir, runtime)
    delay = float(os.environ.get(SLOW_ENV, "0"))

    def slow(payload):
        time.sleep(delay)
        return stage(payload)

    return slow


class SlowEngine:
    """SmolVLM, each window held back ``$FFAI_TEST_STAGE_DELAY_S`` seconds before it runs."""

    info = EngineInfo(SLOW_NAME, "vlm", "experimental", "test only: smolvlm with a delay", SMOLVLM.info.default_model)
    model_types = SMOLVLM.model_types  # it runs SmolVLM's checkpoints: --model smolvlm-demo is its own

    def check_window(self, *args, **kwargs):
        return SMOLVLM.check_window(*args, **kwargs)

    def stages(self):
        first, *rest = SMOLVLM.stages()
        return (StageSpec(first.name, f"{__name__}:slow_preprocess_stage", first.process), *rest)


SLOW_ENGINE = SlowEngine()


def register_slow_engine(folder: Path) -> Path:
    return register_engine(folder, SLOW_NAME, "live_sources:SLOW_ENGINE")


def ffai_env(*paths: Path, **extra: str) -> dict[str, str]:
    """This environment, with ``paths`` and tests/ first on PYTHONPATH and ``extra`` set."""
    parts = [str(p) for p in (*paths, TESTS)] + [os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in parts if p), **extra}


@dataclass
class Run:
    """A running ``ffai caption``: its stdout lines, each with the time it arrived."""

    process: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)
    stderr: str = ""
    _reader: threading.Thread | None = None

    def wait(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout)
        self._reader.join(timeout)
        self.stderr = self.process.stderr.read()
        self.process.stderr.close()
        return code

    def records(self) -> list[dict]:
        return [json.loads(line) for _, line in self.lines]

    def cues(self) -> list[dict]:
        return [r for r in self.records() if "index" in r and "partial" not in r]

    def dropped(self) -> list[dict]:
        return [r for r in self.records() if r.get("dropped")]


def start_caption(*args: str, env: dict[str, str] | None = None, stdin=subprocess.DEVNULL) -> Run:
    """``python -m ffai caption ARGS`` with stdout read line by line as it comes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ffai", "caption", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or ffai_env(),
    )
    run = Run(process)

    def read() -> None:
        for line in process.stdout:
            run.lines.append((time.monotonic(), line))

    run._reader = threading.Thread(target=read, daemon=True)
    run._reader.start()
    return run


def timeline(cues: list[dict]) -> list[tuple[float, float, str]]:
    return [(c["start"], c["end"], c["text"]) for c in cues]
