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
from ffai.media.video import open_video, positioned, probe_video, time_origin, to_image


def probe(file: Path) -> MediaInfo:
    """Kind, display size and duration of `file` (checked: ``check_file``). Reads headers (and a
    video's first frame, which carries the rotation); raises MediaError for anything that is not
    usable media."""
    with open_still(file) as image:
        if image is not None:
            return still_info(file, image)
    return probe_video(file)


def sample(file: Path, fps: float, start: float, duration: float | None, max_frames: int | None) -> Iterator[Frame]:
    """Frames of `file` sampled at `fps` on presentation timestamps (the rule above), decoded
    as the iterator is consumed; the file is closed when it is exhausted or closed. An image
    gives one frame at time 0.0."""
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
        yield from pick(
            positioned(file, container, stream, start, time_origin(stream)), fps, start, duration, max_frames
        )


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
