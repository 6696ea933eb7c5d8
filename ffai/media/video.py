"""Video files by PyAV (FFmpeg): open a file's video stream, decode it in presentation order
with best-effort timestamps, seek near a start time, and turn a frame into an upright RGB8
picture. ``video_encoder`` names the encoder ffai's generated clips are written with."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import av
from PIL import Image, ImageOps

from ffai.errors import MediaError
from ffai.media.boxes import check_sample_claims
from ffai.media.sources import TIME_EPS, MediaInfo, check_size
from ffai.media.stills import opaque

log = logging.getLogger("ffai.media")

_SEEK_BACKOFF_S = 1.0  # first step back when a seek lands after the requested start


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


def reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error)


@contextmanager
def open_video(
    file: Path,
) -> Iterator[tuple[av.container.InputContainer, av.video.stream.VideoStream]]:
    try:
        check_sample_claims(file)
    except OSError as e:
        raise MediaError(f"{file}: cannot read: {e.strerror or e}") from e
    try:
        container = av.open(str(file), metadata_errors="ignore")
    except (av.FFmpegError, OSError) as e:
        raise MediaError(f"{file}: not a readable image or video ({reason(e)})") from e
    try:
        yield container, video_stream(file, container)
    finally:
        container.close()


def video_stream(file: Path, container: av.container.InputContainer) -> av.video.stream.VideoStream:
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
    check_size(file, stream.codec_context.width, stream.codec_context.height)
    # PyAV's default slice threading is kept: frame threading would hide decode errors.
    return stream


def probe_video(file: Path) -> MediaInfo:
    with open_video(file) as (container, stream):
        # The first frame carries the display matrix, which PyAV exposes only on frames.
        frames = decode(file, container, stream, time_origin(stream))
        try:
            first = next(frames, None)
        finally:
            frames.close()
        if first is None:
            if stream.frames > 0:  # the header counts frames, yet none decodes
                raise MediaError(f"{file}: none of the {stream.frames} video frames could be decoded")
            width, height = stream.codec_context.width, stream.codec_context.height
        else:
            width, height = display_size(first[1])
        width, height = check_size(file, width, height)
        return MediaInfo(file, "video", width, height, _duration(container, stream))


# Demuxers whose packets carry the presentation times stored in the file (FFmpeg's names).
# Others (AVI, raw streams) get times FFmpeg guesses in decode order, which name no frame
# until the decoder has reordered them.
_STORED_PTS = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "mpegts", "mpeg", "flv", "nut")


def stores_presentation_times(container: av.container.InputContainer) -> bool:
    """True when the packets of `container` come with the presentation times the file stores."""
    return container.format.name in _STORED_PTS


def time_origin(stream: av.video.stream.VideoStream) -> int:
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


def display_size(frame: av.VideoFrame) -> tuple[int, int]:
    if _quarter_turns(frame) % 2:
        return frame.height, frame.width
    return frame.width, frame.height


_TURNS = {1: Image.Transpose.ROTATE_90, 2: Image.Transpose.ROTATE_180, 3: Image.Transpose.ROTATE_270}


def to_image(frame: av.VideoFrame | Image.Image) -> Image.Image:
    """RGB8, upright. swscale converts any pixel format (10-bit included) using the frame's
    own colourspace and range; a frame of an animated image is Pillow's (``stills.animation``)."""
    if isinstance(frame, Image.Image):
        return opaque(ImageOps.exif_transpose(frame))
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


class _Packets:
    """A stream's packets in decode order, with room to look ahead: packets read ahead and
    handed back come out again first."""

    def __init__(self, file: Path, container: av.container.InputContainer, stream: av.video.stream.VideoStream):
        self.file = file
        self.demux = container.demux(stream)
        self.ahead: deque[av.Packet] = deque()
        self.read_until = 0.0  # the latest time read, for the message of a read error

    def next(self) -> av.Packet | None:
        if self.ahead:
            return self.ahead.popleft()
        try:
            return next(self.demux)
        except StopIteration:
            return None
        except av.FFmpegError as e:
            raise MediaError(f"{self.file}: read error after {self.read_until:.3f} s: {reason(e)}") from e

    def hand_back(self, packets: list[av.Packet]) -> None:
        self.ahead.extendleft(reversed(packets))

    def close(self) -> None:
        self.demux.close()


# How far to read ahead for the next keyframe: a GOP's compressed packets.
_LOOKAHEAD_PACKETS = 600
_LOOKAHEAD_BYTES = 16 * 2**20


def _skip_to_keyframe(packets: _Packets, first: av.Packet, unwanted: Callable[[av.Packet], bool]) -> bool:
    """Drop the run of packets from `first` (unwanted, not a keyframe) to the next keyframe when
    every frame in it is unwanted: decoding restarts at the keyframe, as after a seek, so nothing
    after it needs the run. The keyframe's leading pictures (after it in decode order, before it
    in time: an open GOP's) would miss their references; they are dropped too, and must be
    unwanted as well. Otherwise what was read after `first` is handed back and False returned."""
    held: list[av.Packet] = []
    size = first.size
    while len(held) < _LOOKAHEAD_PACKETS and size < _LOOKAHEAD_BYTES:
        packet = packets.next()
        if packet is None:
            break
        held.append(packet)
        size += packet.size
        if packet.pts is None:
            break
        if packet.is_keyframe:
            return _drop_before(packets, held, unwanted)
        if not unwanted(packet):
            break
    packets.hand_back(held)
    return False


def _drop_before(packets: _Packets, held: list[av.Packet], unwanted: Callable[[av.Packet], bool]) -> bool:
    """``held`` ends at a keyframe: read its leading pictures; when all are unwanted, drop them
    and the run before the keyframe (the keyframe and what follows are handed back); else hand
    back everything read."""
    key = held[-1]
    leading = []
    while (packet := packets.next()) is not None:
        if packet.pts is None or packet.pts > key.pts or not unwanted(packet):
            break
        leading.append(packet)
    rest = [] if packet is None else [packet]
    if packet is not None and (packet.pts is None or packet.pts < key.pts):  # a wanted leading picture
        packets.hand_back([*held, *leading, *rest])
        return False
    packets.hand_back([key, *rest])
    return True


def _drained(context: av.codec.context.CodecContext) -> list[av.VideoFrame]:
    """The frames `context` holds back (reordering), and the decoder reset for a new start."""
    try:
        return context.decode(None)
    finally:
        context.flush_buffers()


def decode(
    file: Path,
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    origin: int,
    unwanted: Callable[[float], bool] | None = None,
) -> Iterator[tuple[float, av.VideoFrame]]:
    """(time, frame) for every frame decoded from the container's current position, in
    presentation order, timed by best-effort pts. A packet the decoder rejects is skipped (as
    ffmpeg does); a read error from the demuxer is a MediaError.

    ``unwanted(time)`` names, by a packet's own pts, frames the caller will not take: those the
    decoder can drop without decoding (nothing references them: FFmpeg's ``skip_frame``
    NONREF) are not decoded, so they never come out; and when every frame from one up to the
    next keyframe is unwanted, that run is not even sent to the decoder (``_skip_to_keyframe``).
    A caller may name a frame only when the frame it takes instead comes out before it.
    Skipping ends for good at the first sign that packet times do not name output frames (a
    frame without pts, times out of order, a packet rejected), so a damaged stream is decoded
    whole from there."""
    skipped = 0
    time: float | None = None
    best_effort = _BestEffortPts()
    context = stream.codec_context
    context.skip_frame = "DEFAULT"  # a decode before this one (a seek's try) may have left it set
    dropping = False
    packets = _Packets(file, container, stream)
    looked_at = 0  # packets to come that a look-ahead read and handed back: not looked ahead from again

    def packet_unwanted(packet: av.Packet) -> bool:
        return (
            unwanted is not None
            and packet.pts is not None
            and unwanted(float((packet.pts - origin) * stream.time_base))
        )

    try:
        while (packet := packets.next()) is not None:
            drop = packet_unwanted(packet)
            restart = False  # the run up to the next keyframe is dropped: decoding restarts there
            if looked_at:
                looked_at -= 1
            elif drop and not packet.is_keyframe:
                restart = _skip_to_keyframe(packets, packet, packet_unwanted)
                looked_at = 0 if restart else len(packets.ahead)
            if drop != dropping and not restart:
                context.skip_frame = "NONREF" if drop else "DEFAULT"
                dropping = drop
            try:
                # As after a seek: the frames the decoder still holds come out, then it starts
                # afresh at the keyframe (it would otherwise wait for the dropped frames).
                frames = _drained(context) if restart else packet.decode()
            except av.FFmpegError:
                skipped += 1
                unwanted = None
                continue
            for frame in frames:
                pts = best_effort(frame.pts, frame.dts)
                previous, time = time, _frame_time(pts, stream, origin, time)
                packets.read_until = time
                if frame.pts is None or pts != frame.pts or (previous is not None and time <= previous):
                    unwanted = None
                yield time, frame
    finally:
        packets.close()
        context.skip_frame = "DEFAULT"
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


def positioned(
    file: Path,
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    start: float,
    origin: int,
    unwanted: Callable[[float], bool] | None = None,
) -> Iterator[tuple[float, av.VideoFrame]]:
    """Decoded frames from a keyframe at or before `start` onwards (``unwanted``: ``decode``'s;
    it must never name a frame before `start`, by which a landing is judged).

    Demuxers seek on decode timestamps or by bisection (MPEG-TS), so a seek can land on a
    keyframe shown after `start`; then this seeks again further back (`_seek_targets`) until
    the first frame is at or before `start`.
    """
    if start <= TIME_EPS:
        yield from decode(file, container, stream, origin, unwanted)
        return
    lowest: int | None = None  # the earliest pts a seek succeeded at
    for target in _seek_targets(start):
        pts = origin + math.floor(target / stream.time_base)
        if not _seek(container, stream, pts):
            continue
        lowest = pts
        frames = decode(file, container, stream, origin, unwanted)
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
    yield from decode(file, container, stream, origin, unwanted)
