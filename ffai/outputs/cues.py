"""What a caption run produces, before any track format: a ``Cue`` per window (its times, the
frames it held, the model's answer), a ``Dropped`` range of windows a live source skipped, and
the ``TrackHeader`` a track carries about its run. ``ffai.outputs.tracks`` writes them in a format,
``ffai.outputs.sheet`` draws them on the contact sheet, both from here.

Timestamps are integers of milliseconds from :meth:`Cue.from_window` on, rounded once.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Thumbnail:
    """A small JPEG of one frame a cue's window held (``ffai.outputs.thumbnails`` makes them)."""

    time_ms: int  # the frame's time, as in ``Cue.frame_times_ms``
    width: int
    height: int
    jpeg: bytes


@dataclass(frozen=True)
class Cue:
    index: int  # 1-based, in output order
    start_ms: int
    end_ms: int
    frame_times_ms: tuple[int, ...]
    text: str
    # The tokens behind ``text``, for callers that compare implementations (the bench); tracks
    # do not carry them: they are the model's vocabulary, not the caption a reader wants.
    token_ids: tuple[int, ...] = ()
    # Pictures of the window's frames, made only for a track that shows them (html): the
    # frames themselves are released with their window; the other formats ignore these.
    thumbnails: tuple[Thumbnail, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.start_ms <= self.end_ms:
            raise ValueError(f"cue {self.index}: bad times {self.start_ms} ms → {self.end_ms} ms")

    @classmethod
    def from_window(cls, window: Any, text: str) -> Cue:
        """The cue of one window (``ffai.run.windows.Window``); seconds are rounded to ms here, once."""
        return cls(
            index=window.index + 1,
            start_ms=round(window.start * 1000),
            end_ms=round(window.end * 1000),
            frame_times_ms=tuple(round(t * 1000) for t in window.frame_times),
            text=text,
        )


@dataclass(frozen=True)
class Dropped:
    """Consecutive windows of a live source skipped to keep up with it (``ffai.run.live``); json and
    jsonl tracks list them among the cues, in timeline order."""

    start_ms: int  # the first skipped window's start
    end_ms: int  # the last one's end
    windows: int

    def __post_init__(self) -> None:
        if not 0 <= self.start_ms <= self.end_ms or self.windows < 1:
            raise ValueError(f"bad dropped range {self.start_ms} ms → {self.end_ms} ms ({self.windows} windows)")

    def as_object(self) -> dict:
        return {"start": self.start_ms / 1000, "end": self.end_ms / 1000, "windows": self.windows}


@dataclass(frozen=True)
class TrackHeader:
    """What a track says about the run besides its cues (json: up to ``seed``; the html page
    shows the decoding options and the creation time too, when known)."""

    source_path: str
    duration: float | None
    width: int | None
    height: int | None
    engine: str
    model: str
    fps: float | None
    window: int | None
    prompt: str | None
    max_new_tokens: int
    seed: int | None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None  # None: off (1.0)
    stop: tuple[str, ...] = ()
    created: str | None = None  # ISO 8601, see creation_time()


def creation_time() -> str:
    """Now, ISO 8601 with the local offset, or ``$SOURCE_DATE_EPOCH`` when set (the reproducible
    builds convention), so that two runs can write byte-identical pages."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).isoformat(timespec="seconds")
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def format_timestamp(ms: int, decimal_marker: str = ".") -> str:
    """``HH:MM:SS.mmm``; hours grow past two digits rather than wrap."""
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{decimal_marker}{millis:03d}"
