"""Captions muxed into the container (``-o clip.mkv``, ``.mp4``, ``.mov``, ``.webm``): the input's
video, audio and subtitle streams copied packet for packet (no decode, no encode: FFmpeg's
``-c copy``), plus one subtitle stream holding the cues, the way a player shows them:

* ``subrip`` in Matroska, ``mov_text`` in MP4 and MOV, ``webvtt`` in WebM; titled with the engine
  and model, tagged with ``--language`` (``und`` when not given) and marked default (a kept
  subtitle stream of the input loses its default mark, so players show ffai's).
* Each cue's payload is written here as FFmpeg's encoder for the codec writes plain text (a test
  holds them equal), not through the encoder: its ASS input has no escape for ``{``, ``}`` or
  ``\\``, which an answer may hold. The text is folded as srt/vtt tracks fold it; WebVTT's is
  escaped as the vtt track escapes it.
* Packets are copied in the input's order; a cue is muxed once the packets before its start are,
  so the file is interleaved as it grows. With ``-ss`` the copy starts at the last video keyframe
  at or before the start (FFmpeg's ``-ss`` with ``-c copy``) and the output's timeline begins
  there; with ``-t`` a stream stops at its first packet decoded (video) or shown (others) at or
  after the end. Cue times are moved by the same amount, so they meet the same frames.
* Written like every file output (``ffai.tracks``' sinks): into a temporary file beside the
  target, renamed into place when the input is done. A run stopped after some cues (Ctrl-C, a
  failure) finishes the file with the streams up to its last cue's end; before any cue it leaves
  nothing.

The input is demuxed in this process (the driver's; on Ray too): packets are read, never decoded.
"""

from __future__ import annotations

import html
import io
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator

from ffai.cues import Cue, Dropped, TrackHeader
from ffai.errors import FfaiError, MediaError, OutputError, UsageError
from ffai.media.sources import is_live, path_of
from ffai.tracks import fold_line_breaks


@dataclass(frozen=True)
class Container:
    muxer: str  # FFmpeg's name for it
    subtitle: str  # the subtitle codec its players read
    label: str  # how messages name it


# -f names and extensions, in the order a container that can hold a stream is suggested.
CONTAINERS = {
    "mkv": Container("matroska", "subrip", "Matroska"),
    "mp4": Container("mp4", "mov_text", "MP4"),
    "mov": Container("mov", "mov_text", "MOV"),
    "webm": Container("webm", "webvtt", "WebM"),
}
DEFAULT_LANGUAGE = "und"  # ISO 639-2 for "undetermined"
_LANGUAGE = re.compile(r"^[a-z]{3}$")
# FFmpeg's readers of animated images (a still reads as a "<codec>_pipe" or image2): not video to copy.
_IMAGE_DEMUXERS = ("gif", "apng", "image2")
_COPIED = ("video", "audio", "subtitle")  # data streams (timecodes) and attachments are left out
_MS = Fraction(1, 1000)
_MOV_TEXT_MAX = 0xFFFF  # a mov_text sample's text length is 16 bits
# FFmpeg's default ASS header: its text subtitle encoders refuse to open without one.
_ASS_HEADER = (
    b"[Script Info]\nScriptType: v4.00+\nPlayResX: 384\nPlayResY: 288\n\n[V4+ Styles]\n"
    b"Format: Name, Fontname, Fontsize, PrimaryColour, SecondaryColour, OutlineColour, BackColour, Bold, Italic, "
    b"Underline, StrikeOut, ScaleX, ScaleY, Spacing, Angle, BorderStyle, Outline, Shadow, Alignment, MarginL, "
    b"MarginR, MarginV, Encoding\n"
    b"Style: Default,Arial,16,&Hffffff,&Hffffff,&H0,&H0,0,0,0,0,100,100,0,0,1,1,0,2,10,10,10,0\n\n"
    b"[Events]\nFormat: Layer, Start, End, Style, Name, MarginL, MarginR, MarginV, Effect, Text\n"
)


def is_container(fmt: str | None) -> bool:
    return fmt in CONTAINERS


def check_language(language: str | None) -> str:
    """``--language``: an ISO 639-2 code of three lowercase letters (Matroska and MP4 store those)."""
    if language is None:
        return DEFAULT_LANGUAGE
    if not _LANGUAGE.match(language):
        raise UsageError(f"--language must be an ISO 639-2 code of three letters such as eng or fra, got {language!r}")
    return language


def check_job(source: str, output: str | None, fmt: str) -> None:
    """What can be told before any input is read: a container goes to a file, and a live source
    cannot be copied into one (its packets are read once, by the decoder)."""
    if output in (None, "-"):
        raise UsageError(f"-f {fmt} writes a file (MP4 and MOV are finished by seeking back): use -o out.{fmt}")
    if is_live(source):
        if fmt in ("mp4", "mov"):
            raise UsageError(
                f"{source}: a live source cannot go into {fmt.upper()}, whose index is written only at the end; "
                "use -o out.mkv"
            )
        raise UsageError(f"{source}: copying a live source into -o {fmt} is not supported yet; write a track (.srt)")


def cue_payload(text: str, codec: str) -> bytes:
    """One cue's packet in ``codec``, as FFmpeg's encoder of that codec writes plain text."""
    lines = fold_line_breaks(text, "\n").split("\n")
    if codec == "webvtt":  # plain text escaped as ffai.tracks.VttFormat escapes it
        lines = [html.escape(line, quote=False) for line in lines]
    data = "\n".join(lines).encode("utf-8")
    if codec != "mov_text":
        return data
    # mov_text: the text's length in 16 bits, then the text, cut at a character if longer
    data = data[:_MOV_TEXT_MAX].decode("utf-8", "ignore").encode("utf-8")
    return len(data).to_bytes(2, "big") + data


def check_source(source: str, output: str, fmt: str) -> None:
    """The input can be copied into ``fmt``: a video file (not a still or an animated image)
    whose every stream the container holds. Reads only the headers; writes nothing."""
    with _open_input(path_of(source), output, fmt) as container:
        _copied_streams(container, source, output, fmt)


class _open_input:
    """The input file opened for demuxing, as a context manager."""

    def __init__(self, path, output: str, fmt: str) -> None:
        import av

        self.path = path
        try:
            self.container = av.open(str(path), metadata_errors="ignore")
        except (av.FFmpegError, OSError) as e:
            raise MediaError(f"{path}: cannot be read for -o {fmt} ({getattr(e, 'strerror', None) or e})") from e

    def __enter__(self):
        return self.container

    def __exit__(self, *exc: object) -> None:
        self.container.close()


def _copied_streams(container, source: str, output: str, fmt: str) -> list:
    name = container.format.name
    if name in _IMAGE_DEMUXERS or name.endswith("_pipe") or not container.streams.video:
        raise UsageError(f"{source}: -o {fmt} needs a video input, not an image; write a track (.srt, .vtt, .json)")
    streams = [s for s in container.streams if s.type in _COPIED]
    holds = _codecs_held(CONTAINERS[fmt].muxer)
    for stream in streams:
        codec = _codec_name(stream)
        if codec not in holds:
            others = [
                f
                for f, c in CONTAINERS.items()
                if f != fmt and all(_codec_name(s) in _codecs_held(c.muxer) for s in streams)
            ]
            fits = f"; -o .{others[0]} can hold it" if others else ""
            raise OutputError(
                f"{output}: {CONTAINERS[fmt].label} cannot hold the {codec} {stream.type} stream of {source}{fits}"
            )
    return streams


def _codec_name(stream) -> str:
    context = stream.codec_context
    return context.codec.name if context is not None else "unknown"


def _codecs_held(muxer: str) -> frozenset[str]:
    import av

    with av.open(io.BytesIO(), "w", format=muxer) as probe:  # in memory: nothing is written
        return frozenset(probe.supported_codecs)


class MuxWriter:
    """Writes cues into a copy of the input's container; the ``TrackWriter`` interface the
    driver uses (``write``, ``close``, ``abort``, ``show``), so it is one more kind of output."""

    shows_text = False  # a container appears whole: no answers shown as they are generated

    def __init__(
        self,
        sink,  # ffai.tracks' file sink: the temporary file and its placing
        fmt: str,
        header: TrackHeader,
        *,
        start: float = 0.0,
        duration: float | None = None,
        language: str | None = None,
    ) -> None:
        import av

        self._container = CONTAINERS[fmt]
        self._sink = sink
        self._count = 0
        self._done = False
        source, output = header.source_path, sink.path
        if header.fps is None:
            raise UsageError(f"{source}: -o {fmt} needs a video input, not an image; write a track (.srt, .vtt, .json)")
        self._opened = _open_input(path_of(source), output, fmt)
        self._input = self._opened.container
        self._temp: str | None = None
        try:
            streams = _copied_streams(self._input, source, output, fmt)
            self._temp = sink.create_temp()
            self._output = av.open(self._temp, "w", format=self._container.muxer)
            self._map = {s.index: self._copy_stream(s) for s in streams}
            self._subtitle = self._subtitle_stream(header, check_language(language))
            self._output.start_encoding()
            self._packets = self._cut(streams, start, duration)
            self._next = next(self._packets, None)
        except BaseException as e:
            self._discard()
            if isinstance(e, (av.FFmpegError, OSError)):
                raise OutputError(f"{output}: {getattr(e, 'strerror', None) or e}") from e
            raise

    # -- streams ------------------------------------------------------------------------------

    def _copy_stream(self, stream):
        out = self._output.add_stream_from_template(stream)
        for key, value in stream.metadata.items():
            if key.lower() != "duration":  # the muxer writes the copy's own duration
                out.metadata[key] = value
        out.disposition = stream.disposition
        if stream.type == "subtitle":  # ffai's stream is the default one
            out.disposition = stream.disposition & ~_disposition().default
        return out

    def _subtitle_stream(self, header: TrackHeader, language: str):
        stream = self._output.add_stream(self._container.subtitle)
        stream.codec_context.subtitle_header = _ASS_HEADER  # mov_text's extradata is made from it
        stream.time_base = _MS
        stream.metadata["title"] = f"{header.engine}: {header.model}"
        stream.metadata["language"] = language
        stream.disposition = _disposition().default
        return stream

    def _cut(self, streams, start: float, duration: float | None) -> Iterator[tuple[float, object]]:
        """(decode time in the output, packet) of every packet copied, in the input's order."""
        video = _main_video(self._input)
        origin = Fraction(video.start_time or 0) * video.time_base  # where cue time 0 is
        begin = origin + Fraction(start)
        end = None if duration is None else begin + Fraction(duration)
        trim = start > 0
        shift = Fraction(0)
        if trim:
            self._input.seek(round(begin / video.time_base), stream=video, backward=True, any_frame=False)
            shift = None  # the first video keyframe sets it
        self._cue_shift = origin  # cue ms -> output seconds, once the shift is known
        stopped: set[int] = set()
        for packet in self._input.demux(streams):
            if packet.dts is None and packet.pts is None:
                continue  # a demuxer's end-of-stream marker
            stream, base = packet.stream, packet.time_base
            shown = Fraction(packet.pts if packet.pts is not None else packet.dts) * base
            decoded = Fraction(packet.dts if packet.dts is not None else packet.pts) * base
            if shift is None:
                if stream is not video or not packet.is_keyframe:
                    continue  # nothing before the first keyframe is kept
                shift = shown
            if stream.index in stopped:
                continue
            if trim and stream is not video and shown < shift:
                continue
            if end is not None and (decoded if stream is video else shown) >= end:
                stopped.add(stream.index)  # video: what follows in decode order may need it
                continue
            offset = round(shift / base)
            if packet.pts is not None:
                packet.pts -= offset
            if packet.dts is not None:
                packet.dts -= offset
            packet.stream = self._map[stream.index]
            self._cue_shift = origin - shift
            yield float(decoded - shift), packet

    def _copy_until(self, seconds: float | None) -> None:
        """Mux the copied packets decoded before ``seconds`` in the output (None: all of them)."""
        while self._next is not None and (seconds is None or self._next[0] < seconds):
            self._output.mux(self._next[1])
            self._next = next(self._packets, None)

    # -- the writer interface -----------------------------------------------------------------

    @property
    def cues_written(self) -> int:
        return self._count

    def show(self, index: int, piece: str) -> None:
        pass  # see shows_text

    def write(self, cue: Cue | Dropped) -> None:
        if self._done:
            raise ValueError("write to a closed output")
        if isinstance(cue, Dropped):  # only live sources drop windows, and they are refused
            return
        self._guarded(self._write_cue, cue)
        self._count += 1

    def _write_cue(self, cue: Cue) -> None:
        import av

        start_s = float(self._cue_shift) + cue.start_ms / 1000
        self._copy_until(start_s)
        payload = cue_payload(cue.text, self._container.subtitle)
        if len(payload) <= (2 if self._container.subtitle == "mov_text" else 0):
            return  # an empty answer shows nothing
        packet = av.Packet(payload)
        packet.time_base = _MS
        packet.pts = packet.dts = round(start_s * 1000)
        packet.duration = cue.end_ms - cue.start_ms
        packet.stream = self._subtitle
        self._output.mux(packet)
        self._last_end = start_s + packet.duration / 1000

    def close(self) -> None:
        """Success: the rest of the streams, then the file is placed."""
        if self._done:
            return
        self._done = True
        self._guarded(self._finish, None)

    def abort(self) -> None:
        """Stopped: with finished cues, a file holding them and the streams up to the last
        one's end; with none, nothing (an existing target untouched)."""
        if self._done:
            return
        self._done = True
        if self._count == 0:
            self._discard()
            return
        self._guarded(self._finish, getattr(self, "_last_end", 0.0))

    def _finish(self, until: float | None) -> None:
        self._copy_until(until)
        self._output.close()
        self._opened.__exit__()
        fd = os.open(self._temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sink.place(self._temp)
        self._temp = None

    def _guarded(self, step, arg) -> None:
        import av

        try:
            step(arg)
        except BaseException as e:
            self._done = True
            self._discard()
            if isinstance(e, (av.FFmpegError, OSError)) and not isinstance(e, FfaiError):
                raise OutputError(f"{self._sink.path}: {getattr(e, 'strerror', None) or e}") from e
            raise

    def _discard(self) -> None:
        for close in (getattr(self, "_output", None), self._opened.container if hasattr(self, "_opened") else None):
            try:
                if close is not None:
                    close.close()
            except Exception:
                pass  # the error that brought us here is the one to report
        if self._temp is not None:
            try:
                os.unlink(self._temp)
            except FileNotFoundError:
                pass
            self._temp = None

    def __enter__(self) -> MuxWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _main_video(container):
    from ffai.media.video import video_stream

    return video_stream(container.name, container)  # the stream ffai samples, whose start is cue time 0


def _disposition():
    import av

    return av.stream.Disposition
