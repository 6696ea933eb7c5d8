"""One rich progress display on stderr for a caption run.

One input: its windows captioned against the number its duration promises, windows per
second, elapsed and ETA. Several: files done of the total with ETA and the failures so far,
and windows captioned over the whole run with windows per second. A live source: how far into
its stream the captions are, how far behind the source, and how many windows were dropped.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

from ffai.media import MediaInfo
from ffai.outputs.cues import Cue, Dropped, format_timestamp
from ffai.run.options import CaptionOptions


def expected_windows(info: MediaInfo, options: CaptionOptions) -> int | None:
    """How many windows a video's duration promises under the sampling options (None: unknown)."""
    if info.kind != "video":
        return 1
    if info.duration is None:
        return None
    seconds = max(info.duration - options.start, 0.0)
    if options.duration is not None:
        seconds = min(seconds, options.duration)
    frames = max(int(seconds * options.fps + 0.999), 1)
    if options.max_frames is not None:
        frames = min(frames, options.max_frames)
    return -(-frames // options.window)


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit")
        if not unit or not task.speed:
            return Text("")
        return Text(f"{task.speed:.2f} {unit}/s")


class _LiveLine:
    """The live part of the windows line. The source's first frame came at ``opened`` (it was
    probed just before), so the stream time it has reached is about the wall time since."""

    def __init__(self, opened: float) -> None:
        self.opened = opened
        self.dropped = 0

    def note(self, item: Cue | Dropped) -> str:
        self.dropped += item.windows if isinstance(item, Dropped) else 0
        captioned = item.end_ms / 1000
        lag = max(0.0, time.monotonic() - self.opened - captioned)
        dropped = f", {self.dropped} dropped" if self.dropped else ""
        return f"stream {format_timestamp(item.end_ms)} captioned, {lag:.1f} s behind{dropped}"


class RunProgress:
    def __init__(self, total_inputs: int, options: CaptionOptions) -> None:
        self._options = options
        self._bar = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _Rate(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self._single = total_inputs == 1
        self._failed = 0
        self._live: _LiveLine | None = None
        self._files = None
        if not self._single:
            self._files = self._bar.add_task("files", total=total_inputs, note="", unit=None)
        self._windows = self._bar.add_task("windows captioned", total=None, note="", unit="windows")

    def __enter__(self) -> RunProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def started(self, info: MediaInfo) -> None:
        # A live source has no length to count against: its line says how far the captions
        # have come in its stream, how far behind the source they are, and what was dropped.
        self._live = _LiveLine(time.monotonic()) if info.live else None
        if self._single:
            self._bar.update(self._windows, total=expected_windows(info, self._options))

    def cue(self, item: Cue | Dropped | None = None) -> None:
        if not isinstance(item, Dropped):
            self._bar.advance(self._windows)
        if self._live is not None and item is not None:
            self._bar.update(self._windows, note=self._live.note(item))

    def finished(self, failed: bool = False) -> None:
        """An input is done, failed for good, or skipped."""
        if self._files is None:
            return
        self._failed += failed
        note = f"{self._failed} failed" if self._failed else ""
        self._bar.update(self._files, advance=1, note=note)
