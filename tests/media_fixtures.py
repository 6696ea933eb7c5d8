"""An independent reading of a clip's timestamps and the sampling rule applied to them, for
tests that check ffai.media against them. The clips themselves come from ffai.bench.sample_media:

    from ffai.bench.sample_media import make_clip
    clip = make_clip(tmp_path / "clip.mp4", seconds=12, fps=25)  # 64x48, about 0.2 s to write
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import av


def decoded_times(path: str | Path) -> list[float]:
    """Every frame's presentation time in seconds from the stream's start_time, decoded here
    with PyAV directly (the reference the sampler is checked against)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        origin = stream.start_time or 0
        return [float((frame.pts - origin) * stream.time_base) for frame in container.decode(stream)]


def expected_sample_times(
    times: Sequence[float],
    fps: float,
    start: float = 0.0,
    duration: float | None = None,
    max_frames: int | None = None,
    eps: float = 1e-6,
) -> list[float]:
    """The sampling rule spelled out literally: for each deadline start + n / fps, the first
    frame at or after it (within [start, start + duration)); a frame picked for several
    deadlines counts once."""
    end = math.inf if duration is None else start + duration
    candidates = sorted(t for t in times if start - eps <= t < end - eps)
    picks: list[float] = []
    n = 0
    while max_frames is None or len(picks) < max_frames:
        deadline = start + n / fps
        pick = next((t for t in candidates if t >= deadline - eps), None)
        if pick is None:
            break
        if not picks or pick != picks[-1]:
            picks.append(pick)
        n += 1
    return picks
