"""One rich progress display on stderr for a caption run.

One input: its windows captioned against the number its duration promises, windows per
second, elapsed and ETA. Several: files done of the total with ETA and the failures so far,
and windows captioned over the whole run with windows per second.
"""

from __future__ import annotations

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

from ffai.captioning import CaptionOptions
from ffai.media import MediaInfo


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
        if self._single:
            self._bar.update(self._windows, total=expected_windows(info, self._options))

    def cue(self) -> None:
        self._bar.advance(self._windows)

    def finished(self, failed: bool = False) -> None:
        """An input is done, failed for good, or skipped."""
        if self._files is None:
            return
        self._failed += failed
        note = f"{self._failed} failed" if self._failed else ""
        self._bar.update(self._files, advance=1, note=note)
