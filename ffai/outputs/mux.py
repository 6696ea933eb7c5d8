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
* The container's tags, chapters and attachments go with the streams, and what the output's
  container cannot hold is named in one warning line (``ffai.outputs.container_extras``); a text
  subtitle stream it cannot hold as it is is converted to its text codec (``_TextSubtitles``).
* Packets are copied in the input's order; a cue is muxed once the packets before its start are,
  so the file is interleaved as it grows. With ``-ss`` the copy starts at the last video keyframe
  at or before the start (FFmpeg's ``-ss`` with ``-c copy``) and the output's timeline begins
  there; with ``-t`` a stream stops at its first packet decoded (video) or shown (others) at or
  after the end. Cue times are moved by the same amount, so they meet the same frames.
* Written like every file output (``ffai.outputs.tracks``' sinks): into a temporary file beside the
  target, renamed into place when the input is done (a live source's at its first cue, then
  growing in place, each cue with the packets before it). A run stopped after some cues (Ctrl-C,
  a failure) finishes the file with the streams up to its last cue's end; before any cue it
  leaves nothing.
* A live source is read once, here, by a ``LiveTee``: its packets are kept for the output and
  its video goes on through a named pipe to the decoder child, which samples it as any live
  source; the copy and the cues' timeline both start at its first video keyframe.

The input is demuxed in this process (the driver's; on Ray too): packets are read, never decoded.
"""

from __future__ import annotations

import functools
import html
import io
import os
import re
import shutil
import sys
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator

from ffai import messages
from ffai.errors import FfaiError, MediaError, OutputError, UsageError
from ffai.media.sources import STDIN, is_live, path_of, source_label
from ffai.outputs import container_extras
from ffai.outputs.cues import Cue, Dropped, TrackHeader
from ffai.outputs.tracks import TrackWriter, check_partial, fold_line_breaks, open_file_sink, open_track
from ffai.outputs.tracks import resolve_format as resolve_track_format


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
_COPIED = ("video", "audio", "subtitle")  # data streams (timecodes) are left out, and said to be
_MS = Fraction(1, 1000)
_LIVE_END_WAIT_S = 2.0  # how long a finished run waits for a live source's reader to see its end
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
    only into a container written as a stream (Matroska, WebM)."""
    if output in (None, "-"):
        raise UsageError(f"-f {fmt} writes a file (MP4 and MOV are finished by seeking back): use -o out.{fmt}")
    if is_live(source) and not streams_live(fmt):
        raise UsageError(
            f"{source_label(source)}: a live source cannot go into {CONTAINERS[fmt].label}, whose index is written "
            "only at the end; use -o out.mkv"
        )


def streams_live(fmt: str) -> bool:
    """Whether ``fmt`` can take a live source: a container written as a stream, valid as it grows."""
    return CONTAINERS[fmt].muxer in ("matroska", "webm")


def cue_payload(text: str, codec: str) -> bytes:
    """One cue's packet in ``codec``, as FFmpeg's encoder of that codec writes plain text."""
    lines = fold_line_breaks(text, "\n").split("\n")
    if codec == "webvtt":  # plain text escaped as ffai.outputs.tracks.VttFormat escapes it
        lines = [html.escape(line, quote=False) for line in lines]
    data = "\n".join(lines).encode("utf-8")
    if codec != "mov_text":
        return data
    # mov_text: the text's length in 16 bits, then the text, cut at a character if longer
    data = data[:_MOV_TEXT_MAX].decode("utf-8", "ignore").encode("utf-8")
    return len(data).to_bytes(2, "big") + data


@dataclass
class CopyPlan:
    """Which of an input's streams go into the output: ``streams`` copied packet for packet, but
    those in ``convert`` (index -> codec), text subtitles converted to the container's text codec;
    ``left_out`` names those that are not, each as a phrase for the warning."""

    streams: list
    convert: dict[int, str]
    left_out: list[str]


def _copied_streams(container, source: str, output: str, fmt: str) -> CopyPlan:
    """The input's streams as ``fmt`` takes them: video and audio it cannot hold are refused (the
    copy would lose what is watched); a text subtitle stream is converted, a picture one left out;
    data streams are left out, a demuxer's own tracks (MP4's chapter track) silently."""
    name = container.format.name
    if name in _IMAGE_DEMUXERS or name.endswith("_pipe") or not container.streams.video:
        raise UsageError(f"{source}: -o {fmt} needs a video input, not an image; write a track (.srt, .vtt, .json)")
    target = CONTAINERS[fmt]
    holds = _codecs_held(target.muxer)
    plan = CopyPlan([], {}, [])
    for stream in container.streams:
        if (
            container_extras.is_attachment(stream)
            or container_extras.is_internal(stream)
            or _timecode_of_video(stream, container)
        ):
            continue  # attachments are the container's (container_extras); the others are not content
        codec = _codec_name(stream)
        if stream.type not in _COPIED:
            plan.left_out.append(
                f"the {stream.type} stream #{stream.index}" + (f" ({codec})" if stream.codec_context else "")
            )
        elif codec in holds:
            plan.streams.append(stream)
        elif stream.type == "subtitle":
            if stream.codec_context is not None and stream.codec_context.codec.text_sub:
                plan.streams.append(stream)
                plan.convert[stream.index] = target.subtitle
            else:
                plan.left_out.append(f"the {codec} subtitle stream #{stream.index}")
        else:
            others = [
                f
                for f, c in CONTAINERS.items()
                if f != fmt
                and all(
                    _codec_name(s) in _codecs_held(c.muxer) for s in container.streams if s.type in ("video", "audio")
                )
            ]
            fits = f"; -o .{others[0]} can hold it" if others else ""
            raise OutputError(
                f"{output}: {target.label} cannot hold the {codec} {stream.type} stream of {source}{fits}"
            )
    return plan


def _timecode_of_video(stream, container) -> bool:
    """A timecode track (MP4's tmcd) whose timecode a video stream's tags hold too: carried by that
    tag, from which the MP4 muxer makes the track again, as ffmpeg carries it."""
    timecode = stream.metadata.get("timecode") if stream.type == "data" else None
    return timecode is not None and any(v.metadata.get("timecode") == timecode for v in container.streams.video)


def _codec_name(stream) -> str:
    context = stream.codec_context  # None: FFmpeg knows no decoder for the stream's codec
    return context.codec.canonical_name if context is not None else "unknown"


@functools.cache
def _codecs_held(muxer: str) -> frozenset[str]:
    import av

    with av.open(io.BytesIO(), "w", format=muxer) as probe:  # in memory: nothing is written
        return frozenset(probe.supported_codecs)


def resolve_format(output: str | None, fmt: str | None) -> str:
    """``-f``, else the output's extension: a track format (``ffai.outputs.tracks``) or a container."""
    return resolve_track_format(output, fmt, more=tuple(CONTAINERS))


def open_output(
    output: str | None,
    fmt: str,
    header: TrackHeader,
    *,
    overwrite: bool,
    partial: bool = False,
    start: float = 0.0,
    duration: float | None = None,
    language: str | None = None,
    tee: LiveTee | None = None,
) -> TrackWriter | MuxWriter:
    """The writer of any output a caption run writes: a container (mkv, mp4, mov, webm) copying
    the file ``header.source_path`` cut at ``start`` for ``duration`` seconds, or the live source
    ``tee`` reads, its subtitle stream tagged ``language``; else ``ffai.outputs.tracks.open_track``'s."""
    if not is_container(fmt):
        return open_track(output, fmt, header, overwrite=overwrite, partial=partial)
    if partial:
        check_partial(output, fmt)
    if tee is None:  # a tee's source is live, and was checked when the tee was made
        check_job(header.source_path, output, fmt)
    sink = open_file_sink(output, fmt, overwrite)
    return open_mux(sink, fmt, header, start=start, duration=duration, language=language, tee=tee)


def check_source(source: str, output: str, fmt: str) -> None:
    """The file ``source`` can be copied into ``fmt``: a video (not a still or an animated image)
    whose every stream the container holds. Reads its headers and first packet; writes nothing."""
    FilePackets(source, output, fmt).close()


def open_mux(
    sink,
    fmt: str,
    header: TrackHeader,
    *,
    start: float = 0.0,
    duration: float | None = None,
    language: str | None = None,
    tee: LiveTee | None = None,
) -> MuxWriter:
    """The writer of one container output into ``sink`` (``ffai.outputs.tracks``' file sink), as
    :func:`open_output` describes it."""
    if header.fps is None:
        raise UsageError(
            f"{header.source_path}: -o {fmt} needs a video input, not an image; write a track (.srt, .vtt, .json)"
        )
    if tee is not None:
        tee.ready.wait()
        if tee.error is not None:
            raise tee.error if isinstance(tee.error, FfaiError) else MediaError(f"{tee.source}: {tee.error}")
        packets = tee
    else:
        packets = FilePackets(header.source_path, sink.path, fmt, start, duration)
    try:
        return MuxWriter(sink, fmt, header, packets, language=language)
    except BaseException:
        packets.close()
        raise


# -- where the copied packets come from -------------------------------------------------------


class FilePackets:
    """A file's packets, cut at ``start`` for ``duration`` seconds (see the module docstring),
    each with its decode time in the output, in the file's order."""

    def __init__(self, source: str, output: str, fmt: str, start: float = 0.0, duration: float | None = None):
        import av

        from ffai.media.boxes import check_sample_claims

        path = self._path = path_of(source)
        try:
            check_sample_claims(path)  # a damaged MP4 index would have FFmpeg allocate gigabytes
            self._input = av.open(str(path), metadata_errors="ignore")
        except (av.FFmpegError, OSError) as e:
            raise MediaError(f"{path}: cannot be read for -o {fmt} ({getattr(e, 'strerror', None) or e})") from e
        try:
            self.plan = _copied_streams(self._input, source, output, fmt)
            video = _main_video(self._input)
            self.cue_offset = 0.0
            self._shift: Fraction | None = None  # where the copy starts in the input, once known
            self._end: Fraction | None = None
            self._packets = self._cut(video, start, duration)
            self._next = next(self._packets, None)
        except BaseException:
            self._input.close()
            raise

    @property
    def streams(self) -> list:
        return self.plan.streams

    def extras(self) -> container_extras.Extras:
        """The input's tags, attachments and chapters in the copy's timeline (known once the first
        packet is: with -ss the copy starts at a keyframe)."""
        return container_extras.read_extras(self._input, str(self._path), self._shift, self._end)

    def _cut(self, video, start: float, duration: float | None) -> Iterator[tuple[float, int, object]]:
        origin = Fraction(video.start_time or 0) * video.time_base  # where cue time 0 is
        begin = origin + Fraction(start)
        end = self._end = None if duration is None else begin + Fraction(duration)
        trim = start > 0
        shift: Fraction | None = Fraction(0)
        self._shift = shift
        if trim:
            self._input.seek(round(begin / video.time_base), stream=video, backward=True, any_frame=False)
            shift = self._shift = None  # the first video keyframe sets it
        self.cue_offset = float(origin)
        stopped: set[int] = set()
        for packet in self._input.demux(self.plan.streams):
            if packet.dts is None and packet.pts is None:
                continue  # a demuxer's end-of-stream marker
            stream, base = packet.stream, packet.time_base
            shown = Fraction(packet.pts if packet.pts is not None else packet.dts) * base
            decoded = Fraction(packet.dts if packet.dts is not None else packet.pts) * base
            if shift is None:
                if stream is not video or not packet.is_keyframe:
                    continue  # nothing before the first keyframe is kept
                shift = self._shift = shown
                self.cue_offset = float(origin - shift)
            if stream.index in stopped or (trim and stream is not video and shown < shift):
                continue
            if end is not None and (decoded if stream is video else shown) >= end:
                stopped.add(stream.index)  # video: what follows in decode order may need it
                continue
            offset = round(shift / base)
            if packet.pts is not None:
                packet.pts -= offset
            if packet.dts is not None:
                packet.dts -= offset
            yield float(decoded - shift), stream.index, packet

    def peek(self) -> tuple[float, int, object] | None:
        return self._next

    def pop(self) -> None:
        self._next = next(self._packets, None)

    def close(self) -> None:
        self._input.close()


class LiveTee:
    """A live source read once, here, for two readers: its packets are kept for the container
    output, and its video is passed on, as NUT through a named pipe (``path``), to the
    decoder that samples it, which reads the pipe as it would the source (a live source).

    A thread opens the pipe (when the decoder opens it), then the source, then copies packets
    from the first video keyframe on, whose time becomes 0 for both readers (and so for the
    cues). A source that cannot be opened or read ends the pipe; ``error`` says why."""

    def __init__(self, source: str, output: str, fmt: str) -> None:
        if source == STDIN and sys.stdin is not None and sys.stdin.isatty():  # as the decoder refuses it
            raise MediaError("stdin: is a terminal; pipe a stream into ffai (… | ffai caption -i -)")
        self.source, self.output, self.fmt = source, output, fmt
        self.error: BaseException | None = None
        self.plan = CopyPlan([], {}, [])
        self._metadata: dict[str, str] = {}
        self.cue_offset = 0.0
        self.ready = threading.Event()  # streams known (or the tee ended)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._packets: deque[tuple[float, int, object]] = deque()  # (decode time, stream index, packet)
        self._source = None  # the open source, kept open while its packets and streams are used
        self._stopping = False
        self._folder = tempfile.mkdtemp(prefix="ffai-tee-")
        self.path = os.path.join(self._folder, "source.nut")
        os.mkfifo(self.path, 0o600)
        self._thread = threading.Thread(target=self._run, name="ffai-live-tee", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import av

        from ffai.media.streams import _open_stream  # the options and errors a live decoder opens with

        pipe = None
        try:
            # Opened by Python, which lets other threads run while it waits for the decoder to
            # open the other end; FFmpeg would wait holding the interpreter.
            file = os.fdopen(os.open(self.path, os.O_WRONLY), "wb", buffering=0)
            # NUT writes each packet as it comes (Matroska holds a cluster back), so the decoder
            # gets every frame the source sent, the last before a stall too.
            pipe = av.open(file, "w", format="nut", options={"flush_packets": "1"})
            if self._stopping:
                return
            self._source = _open_stream(self.source, 0 if self.source == STDIN else None)
            container, video = self._source.__enter__()
            self.plan = _copied_streams(container, source_label(self.source), self.output, self.fmt)
            self._metadata = dict(container.metadata)
            out = pipe.add_stream_from_template(video)
            self.ready.set()
            self._copy(container, video, pipe, out)
        except BaseException as e:  # the decoder then sees the pipe end; the driver says why
            self.error = e
        finally:
            self.ready.set()
            try:
                if pipe is not None:
                    pipe.close()
            except Exception:
                pass  # the reader is gone
            self._done.set()

    def _copy(self, container, video, pipe, out) -> None:
        import av

        shift: Fraction | None = None
        feeding = True
        for packet in container.demux(self.plan.streams):
            if self._stopping:
                return
            if packet.dts is None and packet.pts is None:
                continue
            base = packet.time_base
            shown = Fraction(packet.pts if packet.pts is not None else packet.dts) * base
            if shift is None:
                if packet.stream is not video or not packet.is_keyframe:
                    continue
                shift = shown
            if shown < shift:
                continue
            offset = round(shift / base)
            packet.pts = None if packet.pts is None else packet.pts - offset
            packet.dts = None if packet.dts is None else packet.dts - offset
            decoded = float(Fraction(packet.dts if packet.dts is not None else packet.pts) * base)
            with self._lock:
                self._packets.append((decoded, packet.stream.index, packet))
            if feeding and packet.stream is video:
                copy = av.Packet(bytes(packet))
                copy.pts, copy.dts, copy.duration, copy.time_base = packet.pts, packet.dts, packet.duration, base
                copy.is_keyframe = packet.is_keyframe
                copy.stream = out
                try:
                    pipe.mux(copy)
                except (av.FFmpegError, OSError):
                    feeding = False  # the decoder has stopped reading; the output still gets the packets

    @property
    def streams(self) -> list:
        return self.plan.streams

    def extras(self) -> container_extras.Extras:
        """A live source's tags; chapters and attachments are a file's, not a stream's."""
        return container_extras.Extras(
            {k: v for k, v in self._metadata.items() if k.lower() not in container_extras.MUXER_TAGS}
        )

    def peek(self) -> tuple[float, int, object] | None:
        with self._lock:
            return self._packets[0] if self._packets else None

    def pop(self) -> None:
        with self._lock:
            self._packets.popleft()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the source to end (its last packets kept); False after ``timeout`` seconds."""
        return self._done.wait(timeout)

    def close(self) -> None:
        """Stop reading and remove the pipe. A thread still waiting for a reader to open the pipe
        is given one that closes at once."""
        self._stopping = True
        if not self._done.is_set():
            try:
                os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
            except OSError:
                pass
        elif self._source is not None:  # never while the thread may still be reading it
            self._source.__exit__(None, None, None)
            self._source = None
        shutil.rmtree(self._folder, ignore_errors=True)


class _TextSubtitles:
    """A text subtitle stream the output's container cannot hold as it is (SubRip into MP4),
    converted packet by packet to the container's text codec through FFmpeg's own decoder and
    encoder, as ``ffmpeg -c:s mov_text`` converts it."""

    def __init__(self, stream, codec: str) -> None:
        import av

        self._decoder = stream.codec_context
        self._encoder = av.CodecContext.create(codec, "w")
        self._encoder.subtitle_header = _ASS_HEADER
        self._encoder.open()

    def __call__(self, packet):
        """The packet in the target codec, at the same times; None for one that shows nothing."""
        import av

        subtitles = self._decoder.decode2(packet) if packet.size else None
        if subtitles is None or not len(subtitles):
            return None
        converted = av.Packet(bytes(self._encoder.encode_subtitle(subtitles)))
        converted.time_base = packet.time_base
        converted.pts, converted.dts, converted.duration = packet.pts, packet.dts, packet.duration
        return converted


# -- the writer ------------------------------------------------------------------------------


class MuxWriter:
    """Writes cues into a copy of the input's container; the ``TrackWriter`` interface the
    driver uses (``write``, ``close``, ``abort``, ``show``), so it is one more kind of output.
    ``packets`` is where the copied packets come from (``FilePackets`` or a ``LiveTee``)."""

    shows_text = False  # a container appears whole: no answers shown as they are generated

    def __init__(self, sink, fmt: str, header: TrackHeader, packets, *, language: str | None = None) -> None:
        import av

        self._container = CONTAINERS[fmt]
        self._sink = sink  # ffai.outputs.tracks' file sink: the temporary file and its placing
        self._packets = packets
        self._live = isinstance(packets, LiveTee)
        self._count = 0
        self._last_end = 0.0
        self._done = False
        self._temp: str | None = None  # the file written, until it is placed
        self._written: str | None = None
        self._output = None
        try:
            self._temp = self._written = sink.create_temp()
            # live: each packet reaches the file as it is muxed, so the file is valid as it grows
            options = {"flush_packets": "1", "max_interleave_delta": "1"} if self._live else {}
            self._output = av.open(self._temp, "w", format=self._container.muxer, options=options)
            self._copies: list[container_extras.StreamCopy] = []
            self._converters: dict[int, _TextSubtitles] = {}
            self._map = {s.index: self._copy_stream(s, packets.plan.convert.get(s.index)) for s in packets.streams}
            self._extras = packets.extras()
            container_extras.write_extras(self._output, self._extras, self._container.muxer)
            self._subtitle = self._subtitle_stream(header, check_language(language))
            self._output.start_encoding()
        except BaseException as e:
            self._discard()
            if isinstance(e, (av.FFmpegError, OSError)):
                raise OutputError(f"{sink.path}: {getattr(e, 'strerror', None) or e}") from e
            raise

    def _copy_stream(self, stream, convert_to: str | None):
        """The output's stream for the input's ``stream``: a copy, or with ``convert_to`` a stream of
        that text subtitle codec; its tags and disposition as the input's."""
        if convert_to is None:
            out = self._output.add_stream_from_template(stream)
        else:
            out = self._output.add_stream(convert_to)
            out.codec_context.subtitle_header = _ASS_HEADER
            out.time_base = stream.time_base
            self._converters[stream.index] = _TextSubtitles(stream, convert_to)
        self._copies.append(container_extras.StreamCopy(stream.index, dict(stream.metadata), int(stream.disposition)))
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

    def _copy_until(self, seconds: float | None) -> None:
        """Mux the copied packets decoded before ``seconds`` in the output (None: all of them)."""
        while (item := self._packets.peek()) is not None and (seconds is None or item[0] < seconds):
            _, index, packet = item
            if index in self._converters:
                packet = self._converters[index](packet)
            if packet is not None:
                packet.stream = self._map[index]
                self._output.mux(packet)
            self._packets.pop()

    # -- the writer interface -----------------------------------------------------------------

    @property
    def cues_written(self) -> int:
        return self._count

    def show(self, index: int, piece: str) -> None:
        pass  # see shows_text

    def write(self, cue: Cue | Dropped) -> None:
        if self._done:
            raise ValueError("write to a closed output")
        if isinstance(cue, Dropped):  # a live source's skipped windows: no caption to show
            return
        self._guarded(self._write_cue, cue, interruptible=True)
        self._count += 1

    def _write_cue(self, cue: Cue) -> None:
        import av

        start = self._packets.cue_offset + cue.start_ms / 1000
        self._copy_until(start)
        payload = cue_payload(cue.text, self._container.subtitle)
        if len(payload) > (2 if self._container.subtitle == "mov_text" else 0):  # an empty answer shows nothing
            packet = av.Packet(payload)
            packet.time_base = _MS
            packet.pts = packet.dts = round(start * 1000)
            packet.duration = cue.end_ms - cue.start_ms
            packet.stream = self._subtitle
            self._output.mux(packet)
        self._last_end = start + (cue.end_ms - cue.start_ms) / 1000
        if self._live and self._temp is not None:
            # a stream's file is placed at its first cue and grows in place (the open file
            # follows the rename), as an appended track does
            self._sink.place(self._temp)
            self._temp, self._written = None, self._sink.path

    def close(self) -> None:
        """Success: the rest of the streams, then the file is placed."""
        if self._done:
            return
        self._done = True
        until = None
        # A live source that ended (the decoder saw its end) gives its last packets; one that
        # goes on (the run stopped at -t or --max-frames) is cut at the last cue's end.
        if self._live and not self._packets.wait(_LIVE_END_WAIT_S):
            until = self._last_end
        self._guarded(self._finish, until)

    def abort(self) -> None:
        """Stopped: with finished cues, a file holding them and the streams up to the last
        one's end; with none, nothing (an existing target untouched)."""
        if self._done:
            return
        self._done = True
        if self._count == 0:
            self._discard()
            return
        self._guarded(self._finish, self._last_end)

    def _finish(self, until: float | None) -> None:
        self._copy_until(until)
        self._output.close()
        self._packets.close()
        left = self._packets.plan.left_out + container_extras.left_out(
            self._written, self._extras, self._copies, ignore_flags=int(_disposition().default)
        )
        if left:
            messages.warn(f"{self._sink.path}: left out what {self._container.label} cannot hold: {', '.join(left)}")
        fd = os.open(self._written, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if self._temp is not None:
            self._sink.place(self._temp)
            self._temp = None

    def _guarded(self, step, arg, *, interruptible: bool = False) -> None:
        """Run ``step(arg)``; a failure closes everything and removes the file unless placed.
        ``interruptible``: Ctrl-C between two packets leaves the writer for ``abort`` to finish."""
        import av

        try:
            step(arg)
        except BaseException as e:
            if interruptible and isinstance(e, KeyboardInterrupt):
                raise
            self._done = True
            self._discard()
            if isinstance(e, (av.FFmpegError, OSError)) and not isinstance(e, FfaiError):
                raise OutputError(f"{self._sink.path}: {getattr(e, 'strerror', None) or e}") from e
            raise

    def _discard(self) -> None:
        """Close everything; remove the file unless it was placed (a live one holds its cues)."""
        for item in (self._output, self._packets):
            try:
                if item is not None:
                    item.close()
            except Exception:
                pass  # the error that brought us here is the one to report
        # The sink knows its unplaced file, also one a Ctrl-C left before create_temp returned its name.
        self._sink.discard_temp()
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
