"""What a backend that captions several inputs reports to the one writer of their outputs.

A backend (inline or worker processes on this machine, or actors on a Ray cluster) turns
planned inputs into a stream of ``InputEvent``s; the driver (``ffai.run.jobs``) is the only code
that opens, writes, finishes or aborts an output, and the only code that records a run. Per
input the events come as ``start`` (once, with the probed ``MediaInfo``), then that input's
cues in timeline order, each exactly once, then ``done`` or ``failed``; a probe failure is a
``failed`` with no ``start``. Events of different inputs may interleave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal, Protocol, Sequence

from ffai.media import MediaInfo
from ffai.outputs.cues import Cue

EventKind = Literal["start", "cue", "done", "failed"]


@dataclass(frozen=True)
class InputEvent:
    job: int  # index of the input in the planned run
    kind: EventKind
    info: MediaInfo | None = None  # with "start"
    cue: Cue | None = None  # with "cue"
    error: str | None = None  # with "failed": the one-line reason
    # With "failed": the input itself is fine and a retry may succeed (a worker, actor or node
    # died); a bad input is not transient and is never retried.
    transient: bool = False
    seconds: float | None = None  # with "done" / "failed": wall time spent on the input


class Backend(Protocol):
    """Where inputs are captioned: this machine (``ffai.run.jobs``' local backend) or a Ray cluster
    (``ffai.ray.backend``). Built from the run's ``CaptionOptions`` after the cheap checks
    (warning through ``ffai.messages`` about what they found: a fallback model, a slow dtype);
    entering it starts what it needs (a pipeline, a Ray connection or local cluster) and
    leaving it stops everything it started, also on Ctrl-C."""

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc: object) -> None: ...

    def run(self, inputs: Sequence[tuple[int, str]]) -> Iterator[InputEvent]:
        """Caption ``(job index, source)`` pairs; events as described above. The driver may
        call ``run`` again with inputs that failed transiently (its retries)."""
        ...
