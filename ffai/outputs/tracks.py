"""Cues → caption tracks (srt, vtt, json, jsonl, txt, and html: the contact sheet of
``ffai.outputs.sheet``), written so the file on disk is always complete and valid (DESIGN §6).

Two halves: a *format* turns cues into text (SRT and VTT share one base and differ in a
header and one method, after whisper's ``utils.py``), and a *sink* puts that text somewhere.

File sinks publish through a temporary file beside the target, fsynced and renamed into
place, so a reader (or a kill) never sees a torn file:

* srt, vtt, jsonl, txt — the first cue creates the file (header + cue) by rename; every later
  cue is appended to the same open file, flushed and fsynced. A kill between cues leaves every
  finished cue in a valid file.
* json, html — one document, rewritten whole through a temporary file and renamed for every cue.
* A track with no cue is created only by ``close`` (an empty track is a valid file). A run that
  fails before its first cue (``abort``) creates nothing and leaves an existing target alone,
  even with ``overwrite``.

Stream sinks (``-o -``) write and flush each cue as it comes; json cannot be rewritten on a
stream, so its document is printed once, at ``close`` (or at ``abort`` when cues finished).
On a stream a track may also show answers while they are generated (``TrackWriter.show``): a
still's txt prints its answer piece by piece, the line break when the cue comes; jsonl with
``--partial`` writes an event ``{"partial": true, "index": N, "text": ...}`` (cue N's text so
far) for each piece, before cue N's own line, which is the same as without ``--partial``.

Cues, dropped ranges and headers are ``ffai.outputs.cues``'; timestamps are integers of milliseconds
from :meth:`ffai.outputs.cues.Cue.from_window` on, rounded once.

Cue text is the model's answer with its surrounding whitespace stripped; an answer may hold
line breaks (a list, one item per line). json and jsonl carry it exactly, and so does the txt
track of a still (the answer printed as is). The others fold line breaks in one way,
:func:`fold_line_breaks`: a line break is ``\r\n``, ``\r`` or ``\n`` (or a rarer break that
``str.splitlines`` knows, such as ``\u2028``), and each run of them, together with the
whitespace around and between them (so the blank lines they make), becomes one ``\n`` inside
an srt or vtt cue, where a blank line would end the cue, and one space in a video's txt line,
which holds one cue. Everything else is kept, runs of spaces inside a line included.
"""

from __future__ import annotations

import abc
import datetime
import html
import json
import os
import re
import secrets
import stat
import sys
from typing import IO, ClassVar, Sequence

from ffai.errors import OutputError, UsageError
from ffai.outputs import sheet
from ffai.outputs.cues import Cue, Dropped, TrackHeader, format_timestamp


def _cue_object(cue: Cue) -> dict:
    return {
        "index": cue.index,
        "start": cue.start_ms / 1000,
        "end": cue.end_ms / 1000,
        "frame_times": [t / 1000 for t in cue.frame_times_ms],
        "text": cue.text,
    }


# Whitespace holding at least one of the line breaks str.splitlines() splits at.
_LINE_BREAK_RUN = re.compile(r"\s*[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]\s*")


def fold_line_breaks(text: str, separator: str) -> str:
    """``text`` stripped, each run of line breaks with the whitespace around and between them
    replaced by one ``separator`` (the one folding rule of the module docstring)."""
    return _LINE_BREAK_RUN.sub(separator, text.strip())


def _subtitle_lines(text: str) -> list[str]:
    """The lines of an srt/vtt cue: never a blank one, which would end the cue early."""
    folded = fold_line_breaks(text, "\n")
    return folded.split("\n") if folded else []


# --- formats: cues → text -------------------------------------------------------------


class TrackFormat(abc.ABC):
    """Turns cues into the text of one format. ``appendable`` formats are a header followed by
    one independent block per cue; the others are one document rebuilt from all cues."""

    name: ClassVar[str]
    appendable: ClassVar[bool] = True
    head: ClassVar[str] = ""
    wants_thumbnails: ClassVar[bool] = False  # cues should carry thumbnails of their frames

    def __init__(self, header: TrackHeader, output: str | None = None) -> None:
        self.header = header
        self.output = output  # where the track goes (None or "-": stdout)

    @abc.abstractmethod
    def block(self, cue: Cue) -> str:
        """The text one cue adds to the track."""

    def partial(self, index: int, text: str) -> str | None:
        """The event that shows cue ``index``'s text so far (``text``) while its answer is
        generated (``--partial``); None: this format has none."""
        return None

    def dropped(self, gap: Dropped) -> str | None:
        """What a dropped range adds to an appendable track; None: this format does not list
        them (srt, vtt and txt have no place for a time range without a caption)."""
        return None

    def streams_text(self) -> bool:
        """Whether a cue's block begins with its text as is, so that on a stream the text can be
        printed piece by piece as the answer is generated, and the block's rest after it."""
        return False

    def document(self, cues: Sequence[Cue]) -> str:
        return self.head + "".join(self.block(cue) for cue in cues)


class _SubtitleFormat(TrackFormat):
    """SRT and VTT: the same cue shape, each composed by its own library."""

    def block(self, cue: Cue) -> str:
        return self._compose(cue.index, cue.start_ms, cue.end_ms, _subtitle_lines(cue.text))

    @abc.abstractmethod
    def _compose(self, index: int, start_ms: int, end_ms: int, lines: list[str]) -> str:
        """One cue in this format's own syntax."""


class SrtFormat(_SubtitleFormat):
    name = "srt"

    def _compose(self, index: int, start_ms: int, end_ms: int, lines: list[str]) -> str:
        import srt

        subtitle = srt.Subtitle(
            index=index,
            start=datetime.timedelta(milliseconds=start_ms),
            end=datetime.timedelta(milliseconds=end_ms),
            content="\n".join(lines),
        )
        # reindex=False: keep our cue numbers (and keep an empty caption, which reindexing drops)
        return srt.compose([subtitle], reindex=False)


class VttFormat(_SubtitleFormat):
    name = "vtt"
    head = "WEBVTT\n"

    def _compose(self, index: int, start_ms: int, end_ms: int, lines: list[str]) -> str:
        import webvtt

        # model text is plain text: escape what WebVTT reads as markup (this also defuses "-->")
        escaped = [html.escape(line, quote=False) for line in lines]
        caption = webvtt.Caption(format_timestamp(start_ms), format_timestamp(end_ms), escaped)
        # webvtt-py writes a whole document; a one-caption document less its header is the
        # block, so header + blocks is byte for byte what webvtt-py writes for all captions
        document = webvtt.WebVTT(captions=[caption]).content
        assert document.startswith(self.head), document
        return document[len(self.head) :]


class JsonlFormat(TrackFormat):
    name = "jsonl"

    def block(self, cue: Cue) -> str:
        return json.dumps(_cue_object(cue), ensure_ascii=False) + "\n"

    def partial(self, index: int, text: str) -> str:
        return json.dumps({"partial": True, "index": index, "text": text}, ensure_ascii=False) + "\n"

    def dropped(self, gap: Dropped) -> str:
        return json.dumps({"dropped": True, **gap.as_object()}, ensure_ascii=False) + "\n"


class TxtFormat(TrackFormat):
    name = "txt"

    def block(self, cue: Cue) -> str:
        if self.header.fps is None:  # a still has no timeline: its answer alone, line breaks kept
            return cue.text.strip() + "\n"
        text = fold_line_breaks(cue.text, " ")  # one line per cue
        timing = f"[{format_timestamp(cue.start_ms)} --> {format_timestamp(cue.end_ms)}]"
        return f"{timing} {text}\n" if text else f"{timing}\n"

    def streams_text(self) -> bool:
        return self.header.fps is None  # a still's block is its answer and a line break


class JsonFormat(TrackFormat):
    name = "json"
    appendable = False

    def __init__(self, header: TrackHeader, output: str | None = None) -> None:
        super().__init__(header, output)
        self.gaps: list[Dropped] = []  # dropped ranges, listed by every document from then on

    def dropped(self, gap: Dropped) -> None:
        self.gaps.append(gap)

    def block(self, cue: Cue) -> str:
        # never appended: the whole document is rewritten per cue; a cue alone is its object
        return json.dumps(_cue_object(cue), ensure_ascii=False)

    def document(self, cues: Sequence[Cue]) -> str:
        h = self.header
        doc = {
            "version": 1,
            "source": {"path": h.source_path, "duration": h.duration, "width": h.width, "height": h.height},
            "engine": {"name": h.engine, "model": h.model},
            "params": {
                "fps": h.fps,
                "window": h.window,
                "prompt": h.prompt,
                "max_new_tokens": h.max_new_tokens,
                "seed": h.seed,
            },
            "cues": [_cue_object(cue) for cue in cues],
        }
        if self.gaps:  # a live source that could not be kept up with: what was skipped
            doc["dropped"] = [gap.as_object() for gap in self.gaps]
        return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def read_json_track(path: str | os.PathLike) -> tuple[TrackHeader, list[Cue]]:
    """The header and cues of a json track written by :class:`JsonFormat`; anything else is a
    one-line UsageError naming the file."""
    try:
        with open(path, encoding="utf-8") as file:
            doc = json.load(file)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a JSON track ({e})") from e
    try:
        if doc["version"] != 1:
            raise UsageError(f"{path}: JSON track version {doc['version']!r} is not supported (only 1)")
        source, params = doc["source"], doc["params"]
        header = TrackHeader(
            source_path=str(source["path"]),
            duration=source["duration"],
            width=source["width"],
            height=source["height"],
            engine=str(doc["engine"]["name"]),
            model=str(doc["engine"]["model"]),
            fps=params["fps"],
            window=params["window"],
            prompt=params["prompt"],
            max_new_tokens=params["max_new_tokens"],
            seed=params["seed"],
        )
        cues = [
            Cue(
                index=int(c["index"]),
                start_ms=round(c["start"] * 1000),
                end_ms=round(c["end"] * 1000),
                frame_times_ms=tuple(round(t * 1000) for t in c["frame_times"]),
                text=str(c["text"]),
            )
            for c in doc["cues"]
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{path}: not a JSON track written by ffai ({type(e).__name__}: {e})") from e
    return header, cues


class HtmlFormat(TrackFormat):
    """The contact sheet (``ffai.outputs.sheet``): one self-contained page, rebuilt whole and renamed
    into place for every cue as json is, so an interrupted run leaves a page that opens."""

    name = "html"
    appendable = False
    wants_thumbnails = True

    def __init__(self, header: TrackHeader, output: str | None = None) -> None:
        super().__init__(header, output)
        self._video = sheet.video_source(header.source_path, output) if header.fps is not None else None

    def block(self, cue: Cue) -> str:
        return sheet.card(cue, still=self.header.fps is None)

    def document(self, cues: Sequence[Cue]) -> str:
        return sheet.page(self.header, cues, self._video)


_FORMAT_CLASSES: dict[str, type[TrackFormat]] = {
    cls.name: cls for cls in (SrtFormat, VttFormat, JsonFormat, JsonlFormat, TxtFormat, HtmlFormat)
}
FORMATS: tuple = tuple(_FORMAT_CLASSES)  # ("srt", "vtt", "json", "jsonl", "txt", "html")


def wants_thumbnails(fmt: str) -> bool:
    """Whether a track in ``fmt`` shows its cues' frames (``Cue.thumbnails``)."""
    return fmt in _FORMAT_CLASSES and _FORMAT_CLASSES[fmt].wants_thumbnails


def may_show_answers(output: str | None, fmt: str, partial: bool) -> bool:
    """Whether a track may show answers while they are generated (``TrackWriter.show``), known
    before its input is probed: on a stream, with ``--partial`` or in a format whose blocks may
    begin with the cue's text (a still's txt)."""
    if fmt not in _FORMAT_CLASSES:  # a container (ffai.outputs.mux) appears whole
        return False
    streams = _FORMAT_CLASSES[fmt].streams_text is not TrackFormat.streams_text
    return (_is_stdout(output) or _is_device(output)) and (partial or streams)


def _is_stdout(output: str | None) -> bool:
    return output is None or output == "-"


def resolve_format(output: str | None, fmt: str | None, more: tuple[str, ...] = ()) -> str:
    """``-f`` wins; else the output's extension; stdout without ``-f`` is txt. ``more``: other
    formats a caller writes besides tracks (``ffai.outputs.mux``'s containers)."""
    known = FORMATS + more
    choices = ", ".join(known)
    if fmt is not None:
        if fmt.lower() not in known:
            raise UsageError(f"unknown format {fmt!r} (choose from {choices})")
        return fmt.lower()
    if _is_stdout(output):
        return "txt"
    ext = os.path.splitext(output)[1].lower().lstrip(".")
    if ext not in known:
        found = f"extension '.{ext}'" if ext else "no extension"
        raise UsageError(f"{output}: cannot tell the track format from {found}; use -f ({choices})")
    return ext


def _is_device(path: str) -> bool:
    """A character device or a fifo (``/dev/null``): written in place, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_output(output: str | None, overwrite: bool) -> None:
    """Cheap checks before any work: the output can be created, and may be overwritten."""
    if _is_stdout(output):
        return
    if os.path.isdir(output):
        raise OutputError(f"{output}: is a directory")
    if _is_device(output):
        return  # nothing is replaced, so no -y needed (ffmpeg habit: -o /dev/null)
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.exists(parent):
        raise OutputError(f"{output}: no such directory: {parent}")
    if not os.path.isdir(parent):
        raise OutputError(f"{output}: not a directory: {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{output}: directory is not writable: {parent}")
    if (os.path.lexists(output) or os.path.lexists(os.path.realpath(output))) and not overwrite:
        raise OutputError(f"{output}: already exists (use -y to overwrite)")


def check_not_an_input(output: str | None, own: str, inputs: dict[str, os.PathLike | str]) -> None:
    """``output`` is none of the files ``inputs`` maps its inputs' names to (``own``: the input it is
    the output of), after symbolic and hard links (by device and inode), so that writing it never
    replaces what is read. An OutputError where it is one."""
    # The file the sink writes (symbolic links followed, ".." after a missing folder dropped).
    written = os.path.realpath(output) if not _is_stdout(output) else None
    if written is None or not os.path.exists(written):
        return  # a file not there yet is no input
    target = os.stat(written)
    for name, path in inputs.items():
        try:
            found = os.stat(path)
        except OSError:
            continue  # not a file here (a stream, a URL, a file gone): nothing to replace
        if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
            what = "the output is the input" if name == own else f"the output of {own} is the input {name}"
            raise OutputError(f"{output}: {what} (ffmpeg refuses this too); name another output")


# --- sinks: text → somewhere ----------------------------------------------------------


def open_file_sink(output: str, fmt: str, overwrite: bool) -> _FileSink:
    """The sink of a regular file that a writer other than a track's fills by name and then
    places (``ffai.outputs.mux``'s containers): checked as a track's file is; a device is refused."""
    check_output(output, overwrite)
    if _is_device(output):
        raise OutputError(f"{output}: -f {fmt} writes a regular file, not a device")
    return _FileSink(output, overwrite)


class _StreamSink:
    """A text stream (stdout, a device): written in place and flushed, never rewritten."""

    rewritable = False

    def __init__(self, stream: IO[str], name: str, owned: bool) -> None:
        self._stream = stream
        self._name = name
        self._owned = owned  # close only what we opened; never sys.stdout

    def publish(self, text: str, keep_open: bool) -> None:
        self.append(text)

    def append(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except BrokenPipeError:
            raise  # the reader has gone (`| head`): the CLI ends quietly, as a Unix filter does
        except OSError as e:
            raise OutputError(f"{self._name}: {e.strerror or e}") from e

    def close(self) -> None:
        if self._owned:
            self._stream.close()


class _FileSink:
    """A regular file, replaced atomically through a temporary file beside it."""

    rewritable = True

    def __init__(self, path: str, overwrite: bool) -> None:
        self.path = path
        self._target = os.path.realpath(path)  # follow a symlink instead of replacing it
        self._overwrite = overwrite
        self._owned = False  # True once our file is the target: later renames replace it
        self._file: IO[bytes] | None = None
        # The temporary file created and not yet placed or removed, named before it exists: a
        # Ctrl-C can land between any two steps, and close() then still knows what to remove.
        self._temp: str | None = None

    def publish(self, text: str, keep_open: bool) -> None:
        """Make ``text`` the whole target; keep it open for appends when asked."""
        file = None
        try:
            fd, temp = self._create_temp()
            file = os.fdopen(fd, "wb", buffering=0)
            _write_all(file, text.encode("utf-8"))
            os.fsync(file.fileno())
            self._place(temp)
        except BaseException as e:
            if file is not None:
                file.close()
            self.discard_temp()
            if isinstance(e, OSError):
                raise OutputError(f"{self.path}: {e.strerror or e}") from e
            raise
        if keep_open:
            self._file = file  # the fd now names the target's inode: appends go to the target
        else:
            file.close()

    def append(self, text: str) -> None:
        assert self._file is not None, "append before publish"
        size = self._file.tell()
        try:
            _write_all(self._file, text.encode("utf-8"))
            os.fsync(self._file.fileno())
        except OSError as e:
            self._truncate(size)  # drop a half-written block so the file stays valid
            raise OutputError(f"{self.path}: {e.strerror or e}") from e

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            file.close()
        self.discard_temp()

    def discard_temp(self) -> None:
        """Remove the temporary file not placed yet, if there is one."""
        if self._temp is not None:
            _remove_quietly(self._temp)
            self._temp = None

    def create_temp(self) -> str:
        """A new empty temporary file beside the target, for a writer that fills it by name
        (``ffai.outputs.mux``) and then hands it to :meth:`place`."""
        fd, temp = self._create_temp()
        os.close(fd)
        return temp

    def place(self, temp: str) -> None:
        """Make the finished ``temp`` the target (refused if it appeared meanwhile, without -y)."""
        try:
            self._place(temp)
        except BaseException as e:
            _remove_quietly(temp)
            self._temp = None
            if isinstance(e, OSError):
                raise OutputError(f"{self.path}: {e.strerror or e}") from e
            raise

    def _create_temp(self) -> tuple[int, str]:
        folder, name = os.path.split(self._target)
        for _ in range(16):
            temp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.part")
            self._temp = temp
            try:
                # 0o666 under the umask: the published file gets the usual permissions
                return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temp
            except FileExistsError:
                self._temp = None  # another's file
                continue
            except OSError as e:
                self._temp = None
                raise OutputError(f"{self.path}: {e.strerror or e}") from e
        raise OutputError(f"{self.path}: cannot create a temporary file in {folder}")

    def _place(self, temp: str) -> None:
        if self._owned or self._overwrite:
            os.replace(temp, self._target)
        else:
            self._place_new(temp)
        self._owned = True
        self._temp = None

    def _place_new(self, temp: str) -> None:
        """Rename without clobbering: a hard link fails if the target appeared meanwhile."""
        try:
            os.link(temp, self._target)
        except FileExistsError as e:
            raise OutputError(f"{self.path}: already exists (use -y to overwrite)") from e
        except OSError:
            if os.path.lexists(self._target):  # a filesystem without hard links: check, then rename
                raise OutputError(f"{self.path}: already exists (use -y to overwrite)") from None
            os.replace(temp, self._target)
            return
        os.unlink(temp)

    def _truncate(self, size: int) -> None:
        try:
            self._file.truncate(size)
        except OSError:
            pass  # the write error is the one to report


def _write_all(file: IO[bytes], data: bytes) -> None:
    """Unbuffered, so a failed write leaves nothing pending that a later close would flush."""
    view = memoryview(data)
    while view:
        view = view[file.write(view) :]


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --- the writer ---------------------------------------------------------------------


class TrackWriter:
    """Writes cues, in timeline order, to one track. A context manager: a clean exit closes
    (the track is complete), an exception aborts (finished cues stay, nothing else happens)."""

    def __init__(self, track_format: TrackFormat, sink: _StreamSink | _FileSink, partial: bool = False) -> None:
        self._format = track_format
        self._sink = sink
        self._cues: list[Cue] = []  # kept only for formats rebuilt whole (json)
        self._count = 0
        self._done = False
        # Answers shown while generated go to a stream only: a file appears whole at its first cue.
        self._partial = partial
        self._shows_text = not sink.rewritable and (partial or track_format.streams_text())
        self._shown: dict[int, str] = {}  # cue index -> its text shown so far

    @property
    def shows_text(self) -> bool:
        """Whether :meth:`show` writes anything (so the run should stream its answers)."""
        return self._shows_text

    def show(self, index: int, piece: str) -> None:
        """The next piece of cue ``index``'s text, as its answer is generated: a ``--partial``
        event with its text so far, or the piece itself where the cue's block begins with its
        text (then :meth:`write` adds only the block's rest)."""
        if not self._shows_text or self._done:
            return
        text = self._shown.get(index, "") + piece
        self._shown[index] = text
        self._sink.append(self._format.partial(index, text) if self._partial else piece)

    @property
    def cues_written(self) -> int:
        return self._count

    def write(self, cue: Cue | Dropped) -> None:
        if self._done:
            raise ValueError("write to a closed track")
        if isinstance(cue, Dropped):
            self._write_dropped(cue)
            return
        fmt, sink = self._format, self._sink
        block = fmt.block(cue)
        shown = self._shown.pop(cue.index, "")
        if shown and not self._partial:  # its text is on the stream already
            block = block[len(shown) :] if block.startswith(shown) else "\n" + block
        if fmt.appendable and self._count == 0:
            sink.publish(fmt.head + block, keep_open=True)
        elif fmt.appendable:
            sink.append(block)
        else:
            self._cues.append(cue)
            if sink.rewritable:
                sink.publish(fmt.document(self._cues), keep_open=False)
        self._count += 1

    def _write_dropped(self, gap: Dropped) -> None:
        fmt, sink = self._format, self._sink
        text = fmt.dropped(gap)
        if fmt.appendable:
            if text is None:
                return
            if self._count == 0:
                sink.publish(fmt.head + text, keep_open=True)
            else:
                sink.append(text)
        elif sink.rewritable:
            sink.publish(fmt.document(self._cues), keep_open=False)
        self._count += 1

    def close(self) -> None:
        """Success: leave a complete track, an empty one if no cue came."""
        if self._done:
            return
        self._done = True
        try:
            if self._count == 0 or not (self._format.appendable or self._sink.rewritable):
                self._sink.publish(self._format.document(self._cues), keep_open=False)
        finally:
            self._sink.close()

    def abort(self) -> None:
        """Failure: keep finished cues (already valid on disk); with none, touch nothing."""
        if self._done:
            return
        self._done = True
        try:
            if self._shown and not self._partial:  # end the line an unfinished answer left open
                self._sink.append("\n")
            if self._count and not (self._format.appendable or self._sink.rewritable):
                self._sink.publish(self._format.document(self._cues), keep_open=False)
        finally:
            self._sink.close()

    def __enter__(self) -> TrackWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_track(
    output: str | None,
    fmt: str,
    header: TrackHeader,
    *,
    overwrite: bool,
    stream: IO[str] | None = None,
    partial: bool = False,
) -> TrackWriter:
    """A writer for ``output`` (a path; ``None`` or ``"-"`` is ``stream``, default stdout);
    ``partial`` adds ``--partial`` events (:func:`check_partial`).

    Nothing is created here: the file appears at the first cue, or at ``close``."""
    if fmt not in _FORMAT_CLASSES:
        raise UsageError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    check_output(output, overwrite)
    if partial:
        check_partial(output, fmt)
    track_format = _FORMAT_CLASSES[fmt](header, output)
    if _is_stdout(output):
        sink = _StreamSink(stream if stream is not None else sys.stdout, "stdout", owned=False)
    elif _is_device(output):
        sink = _StreamSink(_open_device(output), output, owned=True)
    else:
        sink = _FileSink(output, overwrite)
    return TrackWriter(track_format, sink, partial)


def check_partial(output: str | None, fmt: str) -> None:
    """``--partial`` events are lines of jsonl on a stream (stdout, a pipe or a device): a file
    shows only finished cues, since it appears whole at its first one."""
    if fmt not in _FORMAT_CLASSES or _FORMAT_CLASSES[fmt].partial is TrackFormat.partial:
        raise UsageError(f"--partial needs -f jsonl (the format is {fmt})")
    if not (_is_stdout(output) or _is_device(output)):
        raise UsageError(f"--partial writes its events to a stream, not to the file {output}: use -o -")


def _open_device(path: str) -> IO[str]:
    try:
        return open(path, "w", encoding="utf-8", newline="\n")
    except OSError as e:
        raise OutputError(f"{path}: {e.strerror or e}") from e
