"""A file read in this process: probed, sampled at a frame rate, or read at given times. Pillow
is asked first (it reads only the header), then PyAV, so a file's content decides what it is,
never its extension. The sampling rule: for each deadline ``start + n / fps``, the first frame
at or after it (``ffai.media``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import av
from PIL import Image

from ffai.errors import MediaError
from ffai.media.sources import TIME_EPS, Frame, MediaInfo
from ffai.media.stills import animation, is_animated, load_image, open_still, still_info
from ffai.media.video import (
    open_video,
    positioned,
    probe_video,
    stores_presentation_times,
    time_origin,
    to_image,
)


def probe(file: Path) -> MediaInfo:
    """Kind, display size and duration of `file` (checked: ``check_file``). Reads headers (and a
    video's first frame, which carries the rotation); raises MediaError for anything that is not
    usable media."""
    with open_still(file) as image:
        if image is not None:
            return still_info(file, image)
    return probe_video(file)


def sample(
    file: Path,
    fps: float,
    start: float,
    duration: float | None,
    max_frames: int | None,
    skip_unsampled: bool = True,
) -> Iterator[Frame]:
    """Frames of `file` sampled at `fps` on presentation timestamps (the rule above), decoded
    as the iterator is consumed; the file is closed when it is exhausted or closed. An image
    gives one frame at time 0.0. ``skip_unsampled``: where the file stores presentation
    times, a video's frames no sample takes and no other frame references are not decoded
    (``Unsampled``); the samples are the same."""
    with open_still(file) as image:
        if image is not None and is_animated(file, image):
            yield from pick(animation(file, image), fps, start, duration, max_frames)
            return
        is_still = image is not None
    if is_still:
        if start <= TIME_EPS:
            yield Frame(0.0, load_image(file))
        return
    with open_video(file) as (container, stream):
        unwanted = Unsampled(fps, start) if skip_unsampled and stores_presentation_times(container) else None
        frames = positioned(file, container, stream, start, time_origin(stream), unwanted)
        yield from pick(frames, fps, start, duration, max_frames)


class Unsampled:
    """Which frames the rule above will not take, told by their times as packets arrive in
    decode order: the rule takes, of each sampling period at or after `start`, only the
    earliest frame, so a frame whose period already holds an earlier one is not a sample
    (``video.decode`` drops such a frame when nothing references it). The earlier frame is
    real and comes out first, so the earliest of each period is never dropped and the samples
    are the same frames. Only the last ``KEPT_PERIODS`` periods are remembered: one forgotten
    only makes its frames count as wanted."""

    KEPT_PERIODS = 64  # far beyond any decoder's reordering delay, at any --fps

    def __init__(self, fps: float, start: float) -> None:
        self.fps, self.start = fps, start
        self.earliest: dict[int, float] = {}  # sampling period -> the earliest time seen in it

    def __call__(self, time: float) -> bool:
        position = (time - self.start + TIME_EPS) * self.fps  # as ``pick`` places it
        if position < 0:  # before start: a seek's landing is judged by these
            return False
        period = math.floor(position)
        earliest = self.earliest.get(period)
        if earliest is not None and earliest < time:
            return True
        self.earliest[period] = time
        if earliest is None and len(self.earliest) > self.KEPT_PERIODS:
            del self.earliest[min(self.earliest)]
        return False


def pick(
    frames: Iterator[tuple[float, av.VideoFrame]],
    fps: float,
    start: float,
    duration: float | None,
    max_frames: int | None,
) -> Iterator[Frame]:
    """The samples among timed frames in presentation order (the rule above)."""
    end = math.inf if duration is None else start + duration
    kept, n = 0, 0  # n: index of the next deadline start + n / fps
    for at, frame in frames:
        if at >= end - TIME_EPS:
            break
        position = (at - start + TIME_EPS) * fps  # in sampling periods after start
        if position < n:  # before start, or before the next deadline
            continue
        yield Frame(at, to_image(frame))
        kept += 1
        if max_frames is not None and kept >= max_frames:
            break
        n = math.floor(position) + 1  # deadlines this frame passed are used up


def frames_at(file: Path, times: tuple[float, ...], tolerance: float) -> Iterator[Frame]:
    """For each of ``times`` (seconds, ascending), the first frame of the video `file` at or
    after it, less ``tolerance`` (times stored rounded name a frame up to half a unit early);
    one frame per time, fewer when the video ends first. Decoded in one pass from the first
    time on; only the frames given are converted to pictures."""
    with open_still(file) as image:
        if image is not None and not is_animated(file, image):
            raise MediaError(f"{file}: a still image, not a video")
        if not times:
            return
        if image is not None:
            yield from first_at(animation(file, image), times, tolerance)
            return
    with open_video(file) as (container, stream):
        start = max(0.0, times[0] - tolerance)
        yield from first_at(positioned(file, container, stream, start, time_origin(stream)), times, tolerance)


def first_at(
    frames: Iterator[tuple[float, av.VideoFrame | Image.Image]], times: tuple[float, ...], tolerance: float
) -> Iterator[Frame]:
    """For each of ``times``, the first of the timed ``frames`` at or after it (``frames_at``)."""
    pending = iter(times)
    target = next(pending)
    for at, frame in frames:
        picture = None
        while at >= target - tolerance - TIME_EPS:
            picture = picture or Frame(at, to_image(frame))
            yield picture
            target = next(pending, None)
            if target is None:
                return
