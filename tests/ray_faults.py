"""Helpers of the Ray tests: a corpus captioned through the driver, a backend that injects a
fault into a real run, and tracks read back."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ffai import messages
from ffai.run import jobs
from ffai.run.options import CaptionOptions


def caption_corpus(
    inputs: list[str], out: Path, options: CaptionOptions, backend=None, pattern: str = "{stem}.json"
) -> tuple[int, list[str]]:
    """Caption ``inputs`` into ``out`` through the corpus driver, on ``backend`` (a backend, or
    a function making one from the run's settled options; default: the local backend); returns
    how many failed and the errors said (``ffai.messages``)."""
    with messages.collect() as said:
        failed = jobs.run_caption_jobs(
            inputs,
            str(out / pattern),
            None,
            options,
            overwrite=False,
            progress=False,
            make_backend=backend if backend is None or callable(backend) else lambda options: backend,
        )
    return failed, [message.text for message in said if message.level == "error"]


class FaultAfterFirstCue:
    """A real backend whose run calls ``fault()`` once, right after the first cue handed on
    while ``ready()`` holds (default: the first cue), so later windows are still in flight on
    the cluster."""

    def __init__(self, backend, fault: Callable[[], None], ready: Callable[[], bool] = lambda: True) -> None:
        self.backend = backend
        self.fault = fault
        self.ready = ready
        self.fired = False

    def __enter__(self):
        self.backend.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.backend.__exit__(*exc)

    def run(self, inputs):
        for event in self.backend.run(inputs):
            yield event
            if event.kind == "cue" and not self.fired and self.ready():
                self.fired = True
                self.fault()


def read_tracks(folder: Path) -> dict[str, bytes]:
    """Every track in ``folder`` (not the run record), by file name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix != ".jsonl"}
