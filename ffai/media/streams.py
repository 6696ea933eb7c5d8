"""Live sources, read as they arrive (``is_live``: standard input, a named pipe or device, a
URL FFmpeg opens): opened once without seeking, probed from the first decoded frame, then
sampled, their frame times stream time from the first frame, continuous across timestamp
jumps. (``ffai.run.live`` is the other half: how a caption run keeps up with such a source.)"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager

import av

from ffai.errors import MediaError
from ffai.media.frame_sampling import pick
from ffai.media.sources import URL_SCHEME, Frame, MediaInfo, check_size, source_label
from ffai.media.video import decode, display_size, reason, video_stream

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
    """Pass frames through, telling the parent now and then that video is arriving (a decoder
    run in this process has no parent to tell: `conn` None)."""
    if conn is None:
        yield from frames
        return
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
        scheme = URL_SCHEME.match(source)
        what = f"{scheme.group(1)}://" if scheme else "this kind of"
        raise MediaError(f"{label}: this FFmpeg build cannot open {what} sources (protocol not found)") from e
    except (av.FFmpegError, OSError) as e:
        raise MediaError(f"{label}: cannot open the stream ({reason(e)})") from e
    try:
        yield container, video_stream(label, container)
    finally:
        container.close()


def live(conn, source: str, fd: int | None, settings: list) -> Iterator[MediaInfo | Frame]:
    """A live decoder child's answers: the probe (from the first decoded frame), then the
    samples, with the sampling arguments the parent has put in `settings` by then."""
    label = source_label(source)
    with _open_stream(source, fd) as (container, stream):
        rate = stream.guessed_rate or stream.average_rate
        step = float(1 / rate) if rate else 1 / 25
        frames = _ticking(_continuous(decode(label, container, stream, 0), step), conn)
        first = next(frames, None)
        if first is None:
            raise MediaError(f"{label}: the stream ended before its first video frame")
        width, height = check_size(label, *display_size(first[1]))
        yield MediaInfo(source, "video", width, height, None, live=True)
        yield from pick(itertools.chain([first], frames), *settings)
