"""What a caption run is asked to do, validated once: ``CaptionOptions``.

The window source, the captioner, the corpus driver, the run record and the progress display all
read these; none of them builds or changes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ffai.engines.contract import DecodingOptions, RuntimeOptions
from ffai.errors import UsageError
from ffai.media import STALL_TIMEOUT_S, check_sampling
from ffai.run.live import DEFAULT_MAX_LAG_S, check_max_lag
from ffai.run.windows import check_window

PLACEMENTS = ("auto", "inline", "workers")
# Windows decoded together by default: a CPU step of a few rows costs little more than one
# (docs/benchmarks.md, "Windows decoded together"); a GPU has room for more.
DEFAULT_BATCH = {"cpu": 4, "auto": 4, "cuda": 8}


def parse_batch(text: str, device: str, compile: bool = False) -> int:
    """``--batch``: a number of windows, or ``auto``: the default on ``device`` (``--device``'s
    value), or 1 with ``--compile``, whose compiled step decodes one window (a batch's steps run
    eager, so a window's tokens never depend on whether it was alone)."""
    if text == "auto":
        return 1 if compile else DEFAULT_BATCH.get(device, 1)
    try:
        batch = int(text)
    except ValueError:
        batch = 0
    if batch < 1:
        raise UsageError(f"--batch must be a number of windows (1 or more) or auto, got {text!r}")
    return batch


@dataclass(frozen=True)
class CaptionOptions:
    """Everything a caption run needs, validated once here."""

    engine: str | None = None
    model: str | None = None
    fps: float = 1.0
    window: int = 8
    start: float = 0.0
    duration: float | None = None
    max_frames: int | None = None
    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    # None: the text stage's batch and one more (at least 2), so a batch can fill while a window is
    # in the vision stage.
    max_in_flight: int | None = None
    placement: str = "auto"  # one of PLACEMENTS; see placement()
    # The answers' text also comes piece by piece as it is generated (Progress.on_text), for a
    # track that shows it; off, the text stage spends nothing on it.
    stream_answers: bool = False
    # Cues carry small pictures of their frames (Cue.thumbnails), for a track that shows them
    # (the html contact sheet); made where the frames are, so no frame outlives its window.
    thumbnails: bool = False
    # A live source (media.is_live) only: windows that fall more than this many seconds behind
    # it are dropped (None: --no-drop, every window captioned); ffai.run.live has the rule.
    max_lag: float | None = DEFAULT_MAX_LAG_S
    # A live source that delivers no video for this many seconds has stalled (an error).
    stall_timeout: float = STALL_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_in_flight is None:
            object.__setattr__(self, "max_in_flight", max(2, self.runtime.batch + 1))
        if self.max_in_flight < 1:
            raise UsageError("--max-in-flight must be at least 1")
        check_sampling(self.fps, self.start, self.duration, self.max_frames)
        check_window(self.window)
        check_max_lag(self.max_lag)
        if not (math.isfinite(self.stall_timeout) and self.stall_timeout > 0):
            raise UsageError(f"--stall-timeout must be a number of seconds > 0, got {self.stall_timeout:g}")
        if self.placement not in PLACEMENTS:
            raise UsageError(f"--placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
