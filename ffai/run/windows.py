"""Samples → windows: the timeline rules of DESIGN §2.

``--window`` consecutive samples make one window (one prompt, one caption). A window starts
at its first sample and ends where the next window starts, so the windows tile the timeline
with no gap and no overlap; the last one ends one sample period after its last sample,
clamped to the clip's end when that is known. The tiling is lazy: it looks one frame ahead
(to learn where a window ends) and never holds more than one window plus that frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol

from ffai.errors import UsageError
from ffai.media.sources import check_fps


class TimedFrame(Protocol):
    """Anything with a presentation time in seconds and a picture (``ffai.media.Frame``)."""

    @property
    def time(self) -> float: ...

    @property
    def image(self) -> Any: ...


@dataclass(frozen=True)
class Window:
    index: int  # 0-based, in timeline order
    frames: tuple  # the consecutive samples of this window
    start: float  # seconds: the first frame's time
    end: float  # seconds: the next window's start, or the clip's end for the last window

    @property
    def frame_times(self) -> tuple[float, ...]:
        return tuple(frame.time for frame in self.frames)


def make_windows(
    frames: Iterable[TimedFrame], size: int, fps: float, clip_end: float | None = None
) -> Iterator[Window]:
    """Group ``frames`` (sampled at ``fps``, in time order) into windows of ``size`` samples.

    The remainder window is kept; ``size=1`` is per-frame; no frames give no windows. Bad
    arguments raise ``UsageError`` here, at the call, not at the first ``next()``.
    """
    check_window(size)
    check_fps(fps)
    return _tile(iter(frames), size, 1.0 / fps, clip_end)


def check_window(size: int) -> None:
    """The one rule for ``--window``."""
    if size < 1:
        raise UsageError(f"--window must be at least 1, got {size}")


_END = object()  # marks the end of the frame iterator (frames themselves may be anything)


def _tile(frames: Iterator[TimedFrame], size: int, period: float, clip_end: float | None) -> Iterator[Window]:
    ordered = _in_order(frames)
    pending = next(ordered, _END)
    index = 0
    while pending is not _END:
        group = [pending]
        pending = _END
        for frame in ordered:
            if len(group) == size:
                pending = frame  # the next window's first frame: it says where this one ends
                break
            group.append(frame)
        end = pending.time if pending is not _END else _last_end(group[-1].time, period, clip_end)
        yield Window(index=index, frames=tuple(group), start=group[0].time, end=end)
        index += 1


def _in_order(frames: Iterator[TimedFrame]) -> Iterator[TimedFrame]:
    """Pass frames through, refusing a time that goes backwards (a cue would end before it starts)."""
    previous = -math.inf
    for frame in frames:
        if frame.time < previous:
            raise ValueError(f"frame times must not decrease: {frame.time} after {previous}")
        previous = frame.time
        yield frame


def _last_end(last_time: float, period: float, clip_end: float | None) -> float:
    """One sample period past the last sample, clamped to the clip's end.

    A container's duration can be shorter than its last timestamp; the clamp never moves the
    end before the last sample, so a cue never has a negative length.
    """
    end = last_time + period
    if clip_end is not None:
        end = max(last_time, min(end, clip_end))
    return end
