"""A rich progress display on stderr: frames decoded, windows captioned, elapsed, ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from ffai.captioning import CaptionOptions, Progress
from ffai.media import MediaInfo


class CaptionProgress:
    def __init__(self, info: MediaInfo, options: CaptionOptions) -> None:
        total_frames = None
        if info.duration is not None:
            seconds = max(info.duration - options.start, 0.0)
            if options.duration is not None:
                seconds = min(seconds, options.duration)
            total_frames = max(int(seconds * options.fps + 0.999), 1)
            if options.max_frames is not None:
                total_frames = min(total_frames, options.max_frames)
        total_windows = None if total_frames is None else -(-total_frames // options.window)
        self._bar = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._frames = self._bar.add_task("frames decoded", total=total_frames)
        self._windows = self._bar.add_task("windows captioned", total=total_windows)

    def __enter__(self) -> Progress:
        self._bar.__enter__()
        return Progress(
            on_frame=lambda _t: self._bar.advance(self._frames),
            on_cue=lambda _cue: self._bar.advance(self._windows),
        )

    def __exit__(self, *exc) -> None:
        self._bar.__exit__(*exc)
