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
- Animated GIF, APNG and WebP files are video, as ffmpeg treats them (a one-frame one is a
  still): Pillow decodes all three (FFmpeg's webp decoder refuses animated WebP), each frame
  timed by the durations of those before it (``_frame_ms``), upright, and RGB8 with any
  transparency composited onto white, the pixels the engine makes of the same picture as a
  still (``_opaque``). A still that only FFmpeg can read (e.g. EXR) is a one-frame video.
- A still is returned upright (EXIF orientation applied) in the mode Pillow read it (RGBA, LA,
  P with its transparency, 16-bit, float, CMYK ...), with no colour conversion: the engine
  converts it once, as its reference does (SmolVLM composites transparency onto white), so
  the model sees the pixels the reference sees for ``PIL.Image.open`` of the same file. Video
  frames are RGB8 (swscale converts them).
- A packet that fails to decode is skipped and counted, as ffmpeg does; the count is logged
  as a warning at the end. A file cut short therefore yields the frames before the cut.
- Live sources (``is_live``: standard input ``-``, a named pipe or device, a URL FFmpeg opens
  such as udp://, tcp://, http(s)://) are read as they arrive, without seeking: probing and
  sampling share one open container in one decoder child. Their frame times are stream time
  from the first decoded frame, kept continuous across timestamp jumps (``DISCONTINUITY_S``).
- Hostile files: every failure is a one-line MediaError naming the file. ``probe``,
  ``load_image`` and ``sample_frames`` run in the calling process; ``Decoder`` runs the same
  three in a child process per file (the caption path uses it), so that a crash inside FFmpeg
  or Pillow fails that file alone and time and memory per file are bounded. Sample counts an
  MP4/MOV claims are checked against the file's size before FFmpeg allocates for them.

ffai never encodes video for the user; ``video_encoder`` names the encoder its generated clips
(the bench's clip, the demo clip, the test clips) are written with on this PyAV build.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from ffai.errors import FfaiError, MediaError, UsageError
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
    path: Path | str  # a live source keeps the name it was given ("-", a URL)
    kind: str  # "image" or "video"
    width: int  # display size: after rotation / EXIF orientation
    height: int
    duration: float | None  # seconds; None for images and live sources
    live: bool = False  # read as it arrives (is_live): no end known, no seeking


@dataclass(frozen=True)
class Frame:
    time: float  # seconds on the source timeline (see module docstring)
    image: Image.Image  # upright; RGB8 for video, a still's own mode (see the module docstring)


# ---------------------------------------------------------------------------- public API

STDIN = "-"
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_live(source: str | Path) -> bool:
    """True for a source read as it arrives, whose end is not known in advance: standard input
    (``-``), a URL (``udp://``, ``tcp://``, ``http://`` ... but not ``file://``), or a path to a
    named pipe, a character device or a socket. A regular file is not live."""
    name = str(source)
    if name == STDIN:
        return True
    if _URL.match(name):
        return is_url(name)
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def is_url(source: str | Path) -> bool:
    """True for a URL FFmpeg opens (``http://``, ``udp://`` ...), which any machine with the
    network can read, unlike standard input or a pipe on this one."""
    scheme = _URL.match(str(source))
    return bool(scheme) and scheme.group(1).lower() != "file"


def source_label(source: str | Path) -> str:
    """How messages name a source: ``stdin`` for ``-``, else the name as given."""
    return "stdin" if str(source) == STDIN else str(source)


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
            if _is_animated(file, image):
                return MediaInfo(file, "video", width, height, _animation_duration(file, image))
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


def frames_at(path: str | Path, times: Sequence[float], tolerance: float = 0.0) -> Iterator[Frame]:
    """For each of ``times`` (seconds, ascending), the first frame of the video at `path` at or
    after it, less ``tolerance`` (times stored rounded name a frame up to half a unit early);
    one frame per time, fewer when the video ends first. Decoded lazily in one pass from the
    first time on; only the frames given are converted to pictures."""
    file = _check_file(path)
    return _frames_at(file, tuple(times), tolerance)


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
    except (ValueError, SyntaxError, EOFError) as e:  # a plugin that recognised the file, then choked on it
        raise MediaError(f"{file}: corrupt image: {e}") from e
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


# A frame that claims under this long (a GIF delay of 0 or 1 hundredth, common in files made
# without one) is shown for _DEFAULT_FRAME_MS, as FFmpeg's GIF demuxer and browsers show it.
_MIN_FRAME_MS = 20
_DEFAULT_FRAME_MS = 100


def _is_animated(file: Path, image: Image.Image) -> bool:
    """More than one frame: an animated GIF, APNG or WebP (Pillow counts them from the headers)."""
    try:
        return getattr(image, "n_frames", 1) > 1
    except Exception as e:  # Pillow raises many types for a corrupt file (IndexError too)
        raise MediaError(f"{file}: corrupt image: {e}") from e


def _frame_ms(image: Image.Image) -> float:
    """How long the frame `image` is seeked to is shown, in milliseconds (Pillow's ``duration``;
    WebP knows it only once the frame is decoded)."""
    if image.info.get("duration") is None:
        image.load()
    ms = image.info.get("duration") or 0
    return ms if ms >= _MIN_FRAME_MS else _DEFAULT_FRAME_MS


def _animation(file: Path, image: Image.Image, *, decode: bool = True) -> Iterator[tuple[float, Image.Image]]:
    """(time, `image` seeked to the frame) for each frame of an animation, a frame's time the
    durations of those before it (summed in ms, so times are as exact as the file's). The image
    is the same object each time, a whole picture (Pillow applies each frame's disposal and
    blending): take what is needed before the next. ``decode=False`` reads only what timing
    needs."""
    elapsed_ms = 0.0
    for index in itertools.count():
        try:
            image.seek(index)
            if decode:
                image.load()
            ms = _frame_ms(image)
        except EOFError:
            return
        except Exception as e:  # as _is_animated
            raise MediaError(f"{file}: cannot decode frame {index + 1}: {e}") from e
        yield elapsed_ms / 1000, image
        elapsed_ms += ms


def _animation_duration(file: Path, image: Image.Image) -> float:
    """Seconds from the first frame to the end of the last."""
    return sum(_frame_ms(frame) for _, frame in _animation(file, image, decode=False)) / 1000


def _opaque(image: Image.Image) -> Image.Image:
    """RGB8: transparency composited onto white, as the engine converts a still (its reference's
    ``convert_to_rgb``), so a frame reaches the model as the same picture would as a still."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


# ---------------------------------------------------------------------------- video


def _reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error)


# ISO base media (MP4, MOV, 3GP ...): the boxes whose children the sample tables sit in, and
# the leading box types that mark such a file.
_BMFF_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}
_BMFF_FIRST = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot"}
_BMFF_MOOV_MAX = 256 << 20  # a sample index larger than this is not read here (nor claimed small)


def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in data[start:end], as FFmpeg's mov
    demuxer walks them: a size of 0 runs to the end, 1 means a 64-bit size follows, a box that
    overruns its parent is cut to it, and a size below the header ends the walk."""
    while start + 8 <= end:
        size, kind = int.from_bytes(data[start : start + 4], "big"), data[start + 4 : start + 8]
        header = 8
        if size == 1 and start + 16 <= end:
            size, header = int.from_bytes(data[start + 8 : start + 16], "big"), 16
        elif size == 0:
            size = end - start
        if size < header:
            return
        yield kind, start + header, min(start + size, end)
        start += size


def _check_sample_claims(file: Path) -> None:
    """Refuse an MP4/MOV whose sample table claims more samples than the file can hold.

    A "stsz" box with one size for every sample stores only that size and a count: FFmpeg then
    builds an index entry (and timing entries) for each claimed sample, so a damaged count in a
    2 KB file grows a decoder to gigabytes before it fails. Samples live in the file, so the
    claim is checked against the file's size first."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8 or head[4:8] not in _BMFF_FIRST:
            return
        offset = 0
        while offset + 8 <= size:
            f.seek(offset)
            header = f.read(16)
            box = int.from_bytes(header[:4], "big")
            box = int.from_bytes(header[8:16], "big") if box == 1 else (size - offset if box == 0 else box)
            if box < 8:
                return
            if header[4:8] == b"moov" and box <= _BMFF_MOOV_MAX:
                f.seek(offset)
                _check_moov(file, f.read(box), size)
            offset += box


def _check_moov(file: Path, moov: bytes, file_size: int) -> None:
    pending = [(0, len(moov))]  # the moov box itself first, then each container box found
    for start, end in pending:
        for kind, payload, stop in _boxes(moov, start, end):
            if kind in _BMFF_CONTAINERS:
                pending.append((payload, stop))
            elif kind == b"stsz" and stop - payload >= 12:
                sample_size = int.from_bytes(moov[payload + 4 : payload + 8], "big")
                count = int.from_bytes(moov[payload + 8 : payload + 12], "big")
                if sample_size and count * sample_size > file_size:
                    raise MediaError(
                        f"{file}: damaged sample table: {count} samples of {sample_size} byte(s) "
                        f"claimed in a file of {file_size} bytes"
                    )


@contextmanager
def _open_video(
    file: Path,
) -> Iterator[tuple[av.container.InputContainer, av.video.stream.VideoStream]]:
    try:
        _check_sample_claims(file)
    except OSError as e:
        raise MediaError(f"{file}: cannot read: {e.strerror or e}") from e
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
    if stream.codec_context is None:  # FFmpeg knows no decoder for the stream's codec id
        raise MediaError(f"{file}: no decoder for its video codec (unknown or damaged codec id)")
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


def _to_image(frame: av.VideoFrame | Image.Image) -> Image.Image:
    """RGB8, upright. swscale converts any pixel format (10-bit included) using the frame's
    own colourspace and range; a frame of an animated image is Pillow's (``_animation``)."""
    if isinstance(frame, Image.Image):
        return _opaque(ImageOps.exif_transpose(frame))
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
        if image is not None and _is_animated(file, image):
            yield from _pick(_animation(file, image), fps, start, duration, max_frames)
            return
        is_still = image is not None
    if is_still:
        if start <= TIME_EPS:
            yield Frame(0.0, load_image(file))
        return
    with _open_video(file) as (container, stream):
        yield from _pick(_positioned(file, container, stream, start, _origin(stream)), fps, start, duration, max_frames)


def _pick(
    frames: Iterator[tuple[float, av.VideoFrame]],
    fps: float,
    start: float,
    duration: float | None,
    max_frames: int | None,
) -> Iterator[Frame]:
    """The samples among timed frames in presentation order (the module docstring's rule)."""
    end = math.inf if duration is None else start + duration
    kept, n = 0, 0  # n: index of the next deadline start + n / fps
    for at, frame in frames:
        if at >= end - TIME_EPS:
            break
        position = (at - start + TIME_EPS) * fps  # in sampling periods after start
        if position < n:  # before start, or before the next deadline
            continue
        yield Frame(at, _to_image(frame))
        kept += 1
        if max_frames is not None and kept >= max_frames:
            break
        n = math.floor(position) + 1  # deadlines this frame passed are used up


# ---------------------------------------------------------------------------- live sources

# A step between consecutive frames' timestamps that goes backwards, or forwards by more than
# this, is a discontinuity (a restarted sender, a wrapped clock), not elapsed time: the
# timeline goes on one nominal frame period after the previous frame. ffmpeg's own threshold
# for formats with discontinuous timestamps (-dts_delta_threshold) is the same 10 s.
DISCONTINUITY_S = 10.0
# How much of a live stream FFmpeg reads to learn its parameters before the first frame.
ANALYZE_S = 1.0
# A live decoder child tells the parent at most this often that video is still arriving, so a
# source is not taken for stalled between two samples far apart (a low --fps).
_TICK_S = 0.2


def _continuous(frames: Iterator[tuple[float, av.VideoFrame]], step: float) -> Iterator[tuple[float, av.VideoFrame]]:
    """(stream time from the first frame, frame): never backwards, never a jump past
    DISCONTINUITY_S; between discontinuities the timestamps' own differences, unchanged."""
    base: float | None = None  # the raw time that maps to 0.0, moved at each discontinuity
    previous = 0.0
    for raw, frame in frames:
        if base is None:
            base = raw
        elif not 0.0 <= raw - previous <= DISCONTINUITY_S:
            base = raw - (previous - base + step)
        previous = raw
        yield raw - base, frame


def _ticking(frames: Iterator, conn) -> Iterator:
    """Pass frames through, telling the parent now and then that video is arriving."""
    last = time.monotonic()
    for item in frames:
        if time.monotonic() - last >= _TICK_S:
            conn.send(("tick",))
            last = time.monotonic()
        yield item


@contextmanager
def _open_stream(
    source: str, fd: int | None
) -> Iterator[tuple[av.container.InputContainer, av.video.stream.VideoStream]]:
    """A live source opened for reading: standard input as the pipe `fd`, anything else by
    name, through FFmpeg's protocols. Nothing here seeks."""
    label = source_label(source)
    url = f"pipe:{fd}" if fd is not None else source
    # FFmpeg reads up to 5 s of a stream to learn its streams' parameters; on a live source
    # that is 5 s before the first caption, and ANALYZE_S finds a frame rate just as well.
    options = {"analyzeduration": str(round(ANALYZE_S * 1_000_000))}
    if url.startswith("udp:"):
        # FFmpeg ends a udp:// read with an error when its receive buffer overruns (the model
        # held decoding back, --no-drop); losing those packets instead is the documented cost.
        options["overrun_nonfatal"] = "1"
    try:
        container = av.open(url, metadata_errors="ignore", container_options=options)
    except av.error.ProtocolNotFoundError as e:
        scheme = _URL.match(source)
        what = f"{scheme.group(1)}://" if scheme else "this kind of"
        raise MediaError(f"{label}: this FFmpeg build cannot open {what} sources (protocol not found)") from e
    except (av.FFmpegError, OSError) as e:
        raise MediaError(f"{label}: cannot open the stream ({_reason(e)})") from e
    try:
        yield container, _video_stream(label, container)
    finally:
        container.close()


def _live(conn, source: str, fd: int | None, settings: list) -> Iterator[MediaInfo | Frame]:
    """A live decoder child's answers: the probe (from the first decoded frame), then the
    samples, with the sampling arguments the parent has put in `settings` by then."""
    label = source_label(source)
    with _open_stream(source, fd) as (container, stream):
        rate = stream.guessed_rate or stream.average_rate
        step = float(1 / rate) if rate else 1 / 25
        frames = _ticking(_continuous(_decode(label, container, stream, 0), step), conn)
        first = next(frames, None)
        if first is None:
            raise MediaError(f"{label}: the stream ended before its first video frame")
        width, height = _check_size(label, *_display_size(first[1]))
        yield MediaInfo(source, "video", width, height, None, live=True)
        yield from _pick(itertools.chain([first], frames), *settings)


def _frames_at(file: Path, times: tuple[float, ...], tolerance: float) -> Iterator[Frame]:
    with _open_still(file) as image:
        if image is not None and not _is_animated(file, image):
            raise MediaError(f"{file}: a still image, not a video")
        if not times:
            return
        if image is not None:
            yield from _first_at(_animation(file, image), times, tolerance)
            return
    with _open_video(file) as (container, stream):
        start = max(0.0, times[0] - tolerance)
        yield from _first_at(_positioned(file, container, stream, start, _origin(stream)), times, tolerance)


def _first_at(
    frames: Iterator[tuple[float, av.VideoFrame | Image.Image]], times: tuple[float, ...], tolerance: float
) -> Iterator[Frame]:
    """For each of ``times``, the first of the timed ``frames`` at or after it (``frames_at``)."""
    pending = iter(times)
    target = next(pending)
    for at, frame in frames:
        picture = None
        while at >= target - tolerance - TIME_EPS:
            picture = picture or Frame(at, _to_image(frame))
            yield picture
            target = next(pending, None)
            if target is None:
                return


# ---------------------------------------------------------------------------- isolation

# Bounds on a decoder child (Decoder): each answer (a probe, an image, the next sample, the
# end) must come within STEP_TIMEOUT_S, and a whole file within FILE_TIMEOUT_S plus
# REALTIME_FACTOR times the media time sampled so far, so that no file can hang a run, however
# it is damaged, while a long clip keeps the time its length needs.
STEP_TIMEOUT_S = 60.0
FILE_TIMEOUT_S = 120.0
REALTIME_FACTOR = 5.0
# A child may map at most this much memory (RLIMIT_AS): FFmpeg and Pillow allocate what a
# header claims (sample tables, frame buffers), and a hostile claim must end in an allocation
# failure, a one-line error, rather than in a machine out of memory. The largest legal frame
# (MAX_SIDE squared: 805 MB as RGB) and a few of its reference frames fit within it.
MEMORY_LIMIT_BYTES = 8 << 30
# A live source that delivers no video for this long (--stall-timeout) has stalled; the default
# covers a sender's start-up and a network's hiccups, and is far below STEP_TIMEOUT_S.
STALL_TIMEOUT_S = 10.0
# Test-only: "crash:NAME" or "hang:NAME" makes the child decoding the file named NAME die of
# SIGSEGV, or stop answering, as a decoder crash or hang would (probing it is left alone).
FAULT_ENV = "FFAI_TEST_DECODER_FAULT"


class _ChildTraceback(Exception):
    """The formatted traceback of an exception raised in a decoder child (shown with -v)."""


class _ForkServer:
    """One clean, single-threaded process that has imported this module and forks a decoder
    child per file: a fork costs milliseconds where a fresh interpreter costs most of a second,
    and forking the caller instead would copy its threads and its model (counted again in
    every child's resident memory). multiprocessing's fork server re-runs the caller's main
    script in every child, hence this one. Children are this server's, so it reaps them and
    reports how each ended."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        code = f"from ffai.media import _serve_forks; _serve_forks({theirs.fileno()})"
        # The folder this ffai was imported from goes first on the server's import path, so it
        # finds the same ffai however this process was started (a checkout without install too);
        # no stdout, which may be the track (-o -), for it or its children.
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self.socket = ours
        self.control = multiprocessing.connection.Connection(os.dup(ours.fileno()))
        self.lock = threading.Lock()
        self.owner = os.getpid()

    def fork(self, request: tuple, fds: tuple[int, ...] = ()) -> tuple[int, multiprocessing.connection.Connection]:
        """A new child running `request` (op, file, args) and holding copies of `fds` (our
        standard input, for a source read from it): its pid and our end of its pipe."""
        ours, theirs = socket.socketpair()
        with self.lock, theirs:
            self.control.send(("fork", (request, len(fds))))
            multiprocessing.reduction.sendfds(self.socket, [theirs.fileno(), *fds])
            pid = self.control.recv()
        return pid, multiprocessing.connection.Connection(ours.detach())

    def reap(self, pid: int) -> int:
        """Wait for child `pid` to end; its wait status."""
        with self.lock:
            self.control.send(("reap", pid))
            return self.control.recv()

    def close(self) -> None:
        self.control.close()
        self.socket.close()
        self.process.wait()


_fork_server: _ForkServer | None = None
# Live sources probed and not yet sampled: their decoder children, by source name.
_live_children: dict[str, _Child] = {}
_live_lock = threading.Lock()
_fork_server_lock = threading.Lock()


def _server() -> _ForkServer:
    global _fork_server
    with _fork_server_lock:
        if _fork_server is None or _fork_server.owner != os.getpid() or _fork_server.process.poll() is not None:
            _fork_server = _ForkServer()
            atexit.register(_fork_server.close)
        return _fork_server


def _serve_forks(fd: int) -> None:
    """The fork server's loop (run as ``python -c``): fork a child per request, reap on request,
    and end when the parent hangs up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    Image.init()  # Pillow imports its format plugins on first open: once here, not in every child
    sock = socket.socket(fileno=fd)
    control = multiprocessing.connection.Connection(os.dup(fd))
    while True:
        try:
            kind, payload = control.recv()
        except (EOFError, OSError):
            return
        if kind == "reap":
            control.send(os.waitpid(payload, 0)[1])
            continue
        request, extra = payload
        child_fd, *passed = multiprocessing.reduction.recvfds(sock, 1 + extra)
        pid = os.fork()
        if pid == 0:
            sock.close()
            control.close()
            try:
                _child_main(multiprocessing.connection.Connection(child_fd), *request, tuple(passed))
            finally:
                os._exit(0)
        for fd_ in (child_fd, *passed):
            os.close(fd_)
        control.send(pid)


class _LogToParent(logging.Handler):
    def __init__(self, conn) -> None:
        super().__init__(logging.WARNING)
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        self.conn.send(("log", record.levelno, record.getMessage()))


def _child_main(conn, op: str, file: Path | str, args: tuple, fds: tuple[int, ...] = ()) -> None:
    """A decoder child's life: run `op` and send its answers, one for each "next" asked,
    until it is exhausted, fails, or the parent hangs up. Each answer carries the seconds the
    child spent on it, so time the parent spent elsewhere does not count against the file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # libtiff and FFmpeg print damage reports straight to fd 2; the parent reports in one line.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    log.addHandler(_LogToParent(conn))
    log.propagate = False

    def show(message, category, filename, lineno, file_=None, line=None) -> None:
        log.warning("%s: %s", file, " ".join(str(message).split()))

    warnings.showwarning = show
    # The fault stand-in strikes while decoding (sampling or loading), after probing succeeded.
    fault = os.environ.get(FAULT_ENV, "") if op != "probe" else ""
    name = Path(str(file)).name
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(hard, MEMORY_LIMIT_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    settings: list = []  # a live source's sampling arguments, sent after its probe
    if op == "sample":
        answers = _sample(file, *args)
    elif op == "frames_at":
        answers = _frames_at(file, *args)
    elif op == "live":
        answers = _live(conn, file, fds[0] if fds else None, settings)
    else:  # one answer, computed when asked for
        answers = (function(file) for function in [{"probe": probe, "load_image": load_image}[op]])
    try:
        while True:
            message = conn.recv()
            if isinstance(message, tuple) and message[0] == "settings":
                settings[:] = message[1]
                continue
            if message != "next":
                return
            started = time.monotonic()
            if fault == f"crash:{name}":
                os.kill(os.getpid(), signal.SIGSEGV)
            if fault == f"hang:{name}":
                time.sleep(3600)
            try:
                answer = next(answers)
            except StopIteration:
                conn.send(("done", None))
                return
            except BaseException as e:
                conn.send(("raise", _portable(e), traceback.format_exc()))
                return
            conn.send(("answer", answer, time.monotonic() - started))
    except (EOFError, BrokenPipeError):  # the parent is done with this file
        return


def _portable(error: BaseException) -> BaseException:
    """`error`, or a stand-in with its type and text when it would not unpickle in the parent."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


class _Child:
    """The parent's end of one decoder child: asks for answers and enforces the time bounds."""

    def __init__(
        self, decoder: Decoder, op: str, file: Path | str, args: tuple = (), fds: tuple[int, ...] = ()
    ) -> None:
        self.decoder, self.file = decoder, source_label(file)
        self.live = op == "live"
        # A live source has no answer to wait for but the next video: silence is a stall. Its
        # first answer, the probe, also waits for the ANALYZE_S of stream FFmpeg reads first.
        self.step_timeout = decoder.stall_timeout + ANALYZE_S if self.live else decoder.step_timeout
        self.server = _server()
        try:
            self.pid, self.conn = self.server.fork((op, file, args), fds)
        except (EOFError, OSError) as e:  # the server is gone: no file can be read
            raise FfaiError(f"cannot start a decoder process for {self.file} (its fork server exited: {e})") from e
        self.busy = 0.0  # seconds the child spent on the answers so far
        self.asked: float | None = None
        self.heard = 0.0  # when the child last said video is arriving (live sources)
        self.status: int | None = None

    def ask(self) -> None:
        """Ask for the next answer now, so the child works while the caller does."""
        if self.asked is None:
            self.conn.send("next")
            self.asked = time.monotonic()

    def answer(self, media_time: float = 0.0):
        """The next answer, or None once the child is exhausted. `media_time` is how far into
        the file the answers have come (it extends the file's time budget, which counts the
        child's working time: a caller that is slow to ask again, as a model is, costs nothing)."""
        try:
            self.ask()
        except OSError:  # it died before it was asked
            raise MediaError(f"{self.file}: the decoder crashed ({self._death()})") from None
        budget = self.decoder.file_timeout + self.decoder.realtime_factor * media_time - self.busy
        file_deadline = self.asked + budget
        while True:
            deadline = min(max(self.asked, self.heard) + self.step_timeout, file_deadline)
            if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise MediaError(self._timeout_message(deadline < file_deadline))
            try:
                kind, *rest = self.conn.recv()
            except (EOFError, OSError):
                raise MediaError(f"{self.file}: the decoder crashed ({self._death()})") from None
            if kind == "log":
                log.log(rest[0], "%s", rest[1])
                continue
            if kind == "tick":
                self.heard = time.monotonic()
                continue
            self.asked = None
            if self.live:
                self.step_timeout = self.decoder.stall_timeout
            if kind == "answer":
                self.busy += rest[1]
                return rest[0]
            if kind == "done":
                return None
            error, child_traceback = rest
            if isinstance(error, FfaiError):
                raise error
            raise error from _ChildTraceback(child_traceback)

    def _timeout_message(self, step: bool) -> str:
        if step and self.live:
            return f"{self.file}: the source stalled: no video for {self.decoder.stall_timeout:g} s (--stall-timeout)"
        limit = f"{self.step_timeout:g} s" if step else "the file's time budget"
        return f"{self.file}: decoding stopped: the decoder gave no answer within {limit}"

    def _death(self) -> str:
        self.close()
        if os.WIFSIGNALED(self.status):
            return f"killed by {signal.Signals(os.WTERMSIG(self.status)).name}"
        return f"exit status {os.waitstatus_to_exitcode(self.status)}"

    def close(self) -> None:
        if self.status is not None:
            return
        self.conn.close()
        try:
            os.kill(self.pid, signal.SIGKILL)  # finished or not: nothing of it is needed now
        except ProcessLookupError:
            pass
        self.status = self.server.reap(self.pid)


@dataclass(frozen=True)
class Decoder:
    """probe, load_image and sample_frames, each file in a child process of its own.

    A crash inside FFmpeg or Pillow on a hostile file (a signal) then kills that child alone
    and ends in a one-line MediaError for that file; a child that stops answering is killed
    past the time bounds (``step_timeout`` per answer, ``file_timeout`` plus
    ``realtime_factor`` times the media time sampled per file); a child's memory is capped
    (MEMORY_LIMIT_BYTES). The cost is a fork per file and a pickled copy of each sample.
    Warnings the child logs reach this process's ``ffai.media`` logger.
    """

    step_timeout: float = STEP_TIMEOUT_S
    file_timeout: float = FILE_TIMEOUT_S
    realtime_factor: float = REALTIME_FACTOR
    stall_timeout: float = STALL_TIMEOUT_S  # a live source that delivers no video this long has stalled

    def _one(self, op: str, path: str | Path):
        child = _Child(self, op, _check_file(path))
        try:
            return child.answer()
        finally:
            child.close()

    def probe(self, path: str | Path) -> MediaInfo:
        """``probe(path)``, in a child. A live source (``is_live``) is opened and read up to its
        first frame; its child stays open for the ``sample_frames`` that follows (a stream
        cannot be read twice), until another probe of the same source replaces it."""
        if is_live(path):
            return self._open_live(str(path)).info
        return self._one("probe", path)

    def _open_live(self, source: str) -> _Child:
        if source == STDIN and sys.stdin is not None and sys.stdin.isatty():
            raise MediaError("stdin: is a terminal; pipe a stream into ffai (… | ffai caption -i -)")
        child = _Child(self, "live", source, fds=(0,) if source == STDIN else ())
        try:
            child.info = child.answer()
        except BaseException:
            child.close()
            raise
        with _live_lock:
            previous, _live_children[source] = _live_children.get(source), child
        if previous is not None:
            previous.close()
        return child

    def load_image(self, path: str | Path) -> Image.Image:
        """``load_image(path)``, in a child."""
        return self._one("load_image", path)

    def sample_frames(
        self,
        path: str | Path,
        fps: float,
        start: float = 0.0,
        duration: float | None = None,
        max_frames: int | None = None,
    ) -> Iterator[Frame]:
        """``sample_frames(...)``, decoded in a child one sample ahead of the caller."""
        check_sampling(fps, start, duration, max_frames)
        args = (fps, start, duration, max_frames)
        if is_live(path):
            return self._frames(lambda: self._live_child(str(path), args), start)
        file = _check_file(path)
        return self._frames(lambda: _Child(self, "sample", file, args), start)

    def _live_child(self, source: str, args: tuple) -> _Child:
        """The child a probe left open for `source`, else a new one (its probe answer unused),
        told how to sample."""
        with _live_lock:
            child = _live_children.pop(source, None)
        if child is None:
            self._open_live(source)
            with _live_lock:
                child = _live_children.pop(source)
        try:
            child.conn.send(("settings", args))
        except OSError:
            raise MediaError(f"{child.file}: the decoder crashed ({child._death()})") from None
        return child

    def frames_at(self, path: str | Path, times: Sequence[float], tolerance: float = 0.0) -> Iterator[Frame]:
        """``frames_at(...)``, decoded in a child one frame ahead of the caller."""
        times = tuple(times)
        file = _check_file(path)
        return self._frames(lambda: _Child(self, "frames_at", file, (times, tolerance)), times[0] if times else 0.0)

    def _frames(self, start_child: Callable[[], _Child], start: float) -> Iterator[Frame]:
        child = start_child()
        try:
            covered = 0.0
            while (frame := child.answer(covered)) is not None:
                covered = max(covered, frame.time - start)
                child.ask()
                yield frame
        finally:
            child.close()
