"""Media input: probe a file, load a still image, sample video frames by timestamp.

Images are decoded by Pillow, video by PyAV (FFmpeg). Which one a file is gets decided by its
content, never its extension: Pillow is asked first (it reads only the header), then PyAV.

Conventions:

- Frame times are seconds on the source timeline, measured from the video stream's
  ``start_time`` (0 when the container gives none), so the first frame of a clip is at ~0.0
  even in formats whose timestamps start elsewhere (MPEG-TS rarely starts at 0). Timestamps
  are FFmpeg's best-effort pts (pts, or dts where pts is out of order as in AVI).
- Sampling keeps, for each deadline ``start + n / fps``, the first decoded frame whose time is
  at or after it (correct for variable frame rate); a frame that covers several deadlines is
  kept once. Comparisons allow ``TIME_EPS`` so a frame stamped exactly on a deadline counts.
- Rotation from the stream's display matrix is applied (multiples of 90 degrees, like
  ffmpeg's autorotate); flips in the matrix and non-square sample aspect ratios are not.
- Animated GIF/WebP/APNG files are images: the first frame. A still that only FFmpeg can read
  (e.g. EXR) is a one-frame video.
- A still is returned upright (EXIF orientation applied) in the mode Pillow read it (RGBA, LA,
  P with its transparency, 16-bit, float, CMYK ...), with no colour conversion: the engine
  converts it once, as its reference does (SmolVLM composites transparency onto white), so
  the model sees the pixels the reference sees for ``PIL.Image.open`` of the same file. Video
  frames are RGB8 (swscale converts them).
- A packet that fails to decode is skipped and counted, as ffmpeg does; the count is logged
  as a warning at the end. A file cut short therefore yields the frames before the cut.

ffai never encodes video for the user; ``video_encoder`` names the encoder its generated clips
(the bench's clip, the demo clip, the test clips) are written with on this PyAV build.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from ffai.errors import MediaError, UsageError
from ffai.windows import check_fps

log = logging.getLogger(__name__)

# Largest width or height accepted, image or video; engines import it for the images they are handed.
MAX_SIDE = 16384
TIME_EPS = 1e-6  # seconds; finer than any real time base step (1/90000 s = 11 us)
_SEEK_BACKOFF_S = 1.0  # first step back when a seek lands after the requested start
_EXIF_SWAPS_AXES = {5, 6, 7, 8}  # orientations that transpose the image


def encoder_available(name: str) -> bool:
    """True when this PyAV build can encode with ``name``."""
    if name not in av.codecs_available:
        return False
    try:
        av.Codec(name, "w")
    except ValueError:  # UnknownCodecError: the name is a decoder only
        return False
    return True


def video_encoder() -> str:
    """h264 (libx264) when this PyAV build has it, else mpeg4 (always among FFmpeg's own encoders)."""
    return "libx264" if encoder_available("libx264") else "mpeg4"


@dataclass(frozen=True)
class MediaInfo:
    path: Path
    kind: str  # "image" or "video"
    width: int  # display size: after rotation / EXIF orientation
    height: int
    duration: float | None  # seconds; None for images


@dataclass(frozen=True)
class Frame:
    time: float  # seconds on the source timeline (see module docstring)
    image: Image.Image  # upright; RGB8 for video, a still's own mode (see the module docstring)


# ---------------------------------------------------------------------------- public API


def probe(path: str | Path) -> MediaInfo:
    """Kind, display size and duration of `path`. Reads headers (and a video's first frame,
    which carries the rotation); raises MediaError for anything that is not usable media."""
    file = _check_file(path)
    with _open_still(file) as image:
        if image is not None:
            width, height = _check_size(file, *image.size)
            if _exif_orientation(file, image) in _EXIF_SWAPS_AXES:
                width, height = height, width
            _verify(file)
            return MediaInfo(file, "image", width, height, None)
    return _probe_video(file)


def load_image(path: str | Path) -> Image.Image:
    """The still image at `path`, upright (EXIF orientation applied), in the mode it was read:
    no colour conversion, so transparency, palettes and 16-bit or float samples reach the engine."""
    file = _check_file(path)
    with _open_still(file) as image:
        if image is None:
            raise MediaError(f"{file}: not an image")
        _check_size(file, *image.size)
        try:
            image.load()
            # A copy either way, so the image outlives the file closed below.
            return ImageOps.exif_transpose(image)
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            raise MediaError(f"{file}: cannot decode image: {e}") from e


def sample_frames(
    path: str | Path,
    fps: float,
    start: float = 0.0,
    duration: float | None = None,
    max_frames: int | None = None,
) -> Iterator[Frame]:
    """Frames of `path` sampled at `fps` on presentation timestamps, decoded lazily.

    Arguments and the file's existence are checked now; the file is opened and decoded only
    as the iterator is consumed, and closed when it is exhausted or closed. An image gives one
    frame at time 0.0.
    """
    check_sampling(fps, start, duration, max_frames)
    file = _check_file(path)
    return _sample(file, fps, start, duration, max_frames)


# ---------------------------------------------------------------------------- checks


def _check_file(path: str | Path) -> Path:
    file = Path(path)
    if not file.exists():
        raise MediaError(f"{file}: no such file")
    if file.is_dir():
        raise MediaError(f"{file}: is a directory")
    if not file.is_file():
        raise MediaError(f"{file}: not a regular file")
    if file.stat().st_size == 0:
        raise MediaError(f"{file}: empty file")
    return file


def _check_size(file: Path, width: int, height: int) -> tuple[int, int]:
    if width <= 0 or height <= 0:
        raise MediaError(f"{file}: invalid size {width}x{height}")
    if width > MAX_SIDE or height > MAX_SIDE:
        raise MediaError(f"{file}: {width}x{height} is too large (the limit is {MAX_SIDE} a side)")
    return width, height


def check_sampling(fps: float, start: float, duration: float | None, max_frames: int | None) -> None:
    """The one rule set for ``--fps``, ``-ss``, ``-t`` and ``--max-frames``, library and CLI alike."""
    check_fps(fps)
    if not (math.isfinite(start) and start >= 0):
        raise UsageError(f"-ss must be a number of seconds >= 0, got {start:g}")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise UsageError(f"-t must be a number of seconds > 0, got {duration:g}")
    if max_frames is not None and max_frames < 1:
        raise UsageError(f"--max-frames must be at least 1, got {max_frames}")


# ---------------------------------------------------------------------------- images


@contextmanager
def _open_still(file: Path) -> Iterator[Image.Image | None]:
    """Pillow's lazy image for `file`, or None when Pillow does not recognise the content."""
    try:
        with warnings.catch_warnings():
            # Our own MAX_SIDE bound applies; Pillow's hard bomb limit still raises below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(file)
    except UnidentifiedImageError:
        image = None
    except Image.DecompressionBombError as e:
        raise MediaError(f"{file}: image too large: {e}") from e
    except OSError as e:
        raise MediaError(f"{file}: cannot read: {e.strerror or e}") from e
    # Pillow identifies MPEG video headers but cannot decode them: leave those to PyAV.
    if image is not None and image.format == "MPEG":
        image.close()
        image = None
    try:
        yield image
    finally:
        if image is not None:
            image.close()


def _exif_orientation(file: Path, image: Image.Image) -> int:
    try:
        # JPEG and WebP keep EXIF in the header; PNG may put it after the pixels, so Pillow
        # decodes a PNG here.
        exif = image.getexif()
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise MediaError(f"{file}: corrupt image: {e}") from e
    orientation = exif.get(ExifTags.Base.Orientation, 1)
    return orientation if isinstance(orientation, int) else 1


def _verify(file: Path) -> None:
    """Pillow's structural check (PNG: chunk CRCs); it needs a freshly opened image."""
    try:
        with Image.open(file) as image:
            image.verify()
    except Exception as e:  # Pillow raises many types for a corrupt file
        raise MediaError(f"{file}: corrupt image: {e}") from e


# ---------------------------------------------------------------------------- video


def _reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error)


@contextmanager
def _open_video(
    file: Path,
) -> Iterator[tuple[av.container.InputContainer, av.video.stream.VideoStream]]:
    try:
        container = av.open(str(file), metadata_errors="ignore")
    except (av.FFmpegError, OSError) as e:
        raise MediaError(f"{file}: not a readable image or video ({_reason(e)})") from e
    try:
        yield container, _video_stream(file, container)
    finally:
        container.close()


def _video_stream(file: Path, container: av.container.InputContainer) -> av.video.stream.VideoStream:
    # Cover art in an audio file is a one-picture "video" stream: not a video.
    cover_art = av.stream.Disposition.attached_pic
    candidates = [s for s in container.streams.video if not s.disposition & cover_art]
    if not candidates:
        has_audio = len(container.streams.audio) > 0
        raise MediaError(f"{file}: no video stream" + (" (audio only)" if has_audio else ""))
    best = container.streams.best("video")
    stream = best if best in candidates else candidates[0]
    if stream.codec_context is None:
        raise MediaError(f"{file}: no decoder for video codec {stream.codec.name!r}")
    # The header's size (filled in by FFmpeg's stream probing), checked before any decoding.
    _check_size(file, stream.codec_context.width, stream.codec_context.height)
    # PyAV's default slice threading is kept: frame threading would hide decode errors.
    return stream


def _probe_video(file: Path) -> MediaInfo:
    with _open_video(file) as (container, stream):
        # The first frame carries the display matrix, which PyAV exposes only on frames.
        frames = _decode(file, container, stream, _origin(stream))
        try:
            first = next(frames, None)
        finally:
            frames.close()
        if first is None:
            if stream.frames > 0:  # the header counts frames, yet none decodes
                raise MediaError(f"{file}: none of the {stream.frames} video frames could be decoded")
            width, height = stream.codec_context.width, stream.codec_context.height
        else:
            width, height = _display_size(first[1])
        width, height = _check_size(file, width, height)
        return MediaInfo(file, "video", width, height, _duration(container, stream))


def _origin(stream: av.video.stream.VideoStream) -> int:
    """The pts (stream time base) that maps to time 0.0."""
    return stream.start_time if stream.start_time is not None else 0


def _duration(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _quarter_turns(frame: av.VideoFrame) -> int:
    """Counter-clockwise quarter turns that make `frame` upright (display matrix, rounded)."""
    return round(frame.rotation / 90) % 4


def _display_size(frame: av.VideoFrame) -> tuple[int, int]:
    if _quarter_turns(frame) % 2:
        return frame.height, frame.width
    return frame.width, frame.height


_TURNS = {1: Image.Transpose.ROTATE_90, 2: Image.Transpose.ROTATE_180, 3: Image.Transpose.ROTATE_270}


def _to_image(frame: av.VideoFrame) -> Image.Image:
    """RGB8, upright. swscale converts any pixel format (10-bit included) using the frame's
    own colourspace and range."""
    image = frame.to_image()
    turns = _quarter_turns(frame)
    return image.transpose(_TURNS[turns]) if turns else image


class _BestEffortPts:
    """A frame's presentation timestamp the way FFmpeg guesses it (guess_correct_pts): trust
    pts unless it has gone backwards more often than the decode timestamps have. AVI has no
    pts, so with B-frames its "pts" arrive out of order while its dts are in display order."""

    def __init__(self) -> None:
        self.faulty_pts = self.faulty_dts = 0
        self.last_pts: int | None = None
        self.last_dts: int | None = None

    def __call__(self, pts: int | None, dts: int | None) -> int | None:
        if dts is not None:
            self.faulty_dts += self.last_dts is not None and dts <= self.last_dts
            self.last_dts = dts
        if pts is not None:
            self.faulty_pts += self.last_pts is not None and pts <= self.last_pts
            self.last_pts = pts
        if pts is not None and (self.faulty_pts <= self.faulty_dts or dts is None):
            return pts
        return dts


def _frame_time(pts: int | None, stream: av.video.stream.VideoStream, origin: int, previous: float | None) -> float:
    if pts is not None:
        return float((pts - origin) * stream.time_base)
    # No timestamps at all (a raw elementary stream): step by the nominal frame rate.
    rate = stream.guessed_rate or stream.average_rate or Fraction(25)
    return 0.0 if previous is None else previous + float(1 / rate)


def _decode(
    file: Path, container: av.container.InputContainer, stream: av.video.stream.VideoStream, origin: int
) -> Iterator[tuple[float, av.VideoFrame]]:
    """(time, frame) for every frame decoded from the container's current position, in
    presentation order, timed by best-effort pts. A packet the decoder rejects is skipped (as
    ffmpeg does); a read error from the demuxer is a MediaError."""
    skipped = 0
    time: float | None = None
    best_effort = _BestEffortPts()
    packets = container.demux(stream)
    try:
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                return
            except av.FFmpegError as e:
                raise MediaError(f"{file}: read error after {time or 0.0:.3f} s: {_reason(e)}") from e
            try:
                frames = packet.decode()
            except av.FFmpegError:
                skipped += 1
                continue
            for frame in frames:
                time = _frame_time(best_effort(frame.pts, frame.dts), stream, origin, time)
                yield time, frame
    finally:
        packets.close()
        if skipped:
            log.warning("%s: skipped %d video packet(s) that failed to decode", file, skipped)


def _seek_targets(start: float) -> Iterator[float]:
    """Seconds to try seeking to, from `start` backwards: start, start - 1, start - 2,
    start - 4 ... while positive, then 0, then -1 (MPEG-TS needs a target below the first
    pts, whose decode timestamp is earlier still; AVI refuses one)."""
    back = 0.0
    while start - back > 0:
        yield start - back
        back = max(_SEEK_BACKOFF_S, 2 * back)
    yield 0.0
    yield -_SEEK_BACKOFF_S


def _seek(container: av.container.InputContainer, stream: av.video.stream.VideoStream, pts: int) -> bool:
    """Seek to the keyframe at or before `pts`; False (and the position unchanged) on failure."""
    try:
        container.seek(pts, stream=stream, backward=True)
    except av.FFmpegError:
        return False
    return True


def _positioned(
    file: Path,
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    start: float,
    origin: int,
) -> Iterator[tuple[float, av.VideoFrame]]:
    """Decoded frames from a keyframe at or before `start` onwards.

    Demuxers seek on decode timestamps or by bisection (MPEG-TS), so a seek can land on a
    keyframe shown after `start`; then this seeks again further back (`_seek_targets`) until
    the first frame is at or before `start`.
    """
    if start <= TIME_EPS:
        yield from _decode(file, container, stream, origin)
        return
    lowest: int | None = None  # the earliest pts a seek succeeded at
    for target in _seek_targets(start):
        pts = origin + math.floor(target / stream.time_base)
        if not _seek(container, stream, pts):
            continue
        lowest = pts
        frames = _decode(file, container, stream, origin)
        first = next(frames, None)
        if first is not None and first[0] <= start + TIME_EPS:
            yield first
            yield from frames
            return
        frames.close()
    # Every landing was after `start`: the stream's first frame is. Go back to the earliest
    # landing; with no successful seek at all, nothing was read and this is the beginning.
    if lowest is not None:
        _seek(container, stream, lowest)
    yield from _decode(file, container, stream, origin)


def _sample(file: Path, fps: float, start: float, duration: float | None, max_frames: int | None) -> Iterator[Frame]:
    with _open_still(file) as image:
        is_still = image is not None
    if is_still:
        if start <= TIME_EPS:
            yield Frame(0.0, load_image(file))
        return
    end = math.inf if duration is None else start + duration
    kept, n = 0, 0  # n: index of the next deadline start + n / fps
    with _open_video(file) as (container, stream):
        for time, frame in _positioned(file, container, stream, start, _origin(stream)):
            if time >= end - TIME_EPS:
                break
            position = (time - start + TIME_EPS) * fps  # in sampling periods after start
            if position < n:  # before start, or before the next deadline
                continue
            yield Frame(time, _to_image(frame))
            kept += 1
            if max_frames is not None and kept >= max_frames:
                break
            n = math.floor(position) + 1  # deadlines this frame passed are used up
