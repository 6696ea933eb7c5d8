"""``Decoder``, the one front door to media: probe, load_image, sample_frames and frames_at,
each file in a decoder child of its own (``sandbox``), or in this process when asked."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from PIL import Image

from ffai.errors import MediaError
from ffai.media.sandbox import (
    FILE_TIMEOUT_S,
    REALTIME_FACTOR,
    STALL_TIMEOUT_S,
    STEP_TIMEOUT_S,
    Bounds,
    Child,
    Sandbox,
    op_answers,
)
from ffai.media.sources import STDIN, Frame, MediaInfo, check_file, check_sampling, is_live, source_label


class _InProcess:
    """An operation run in this process, with a decoder child's interface (``Child``): the
    same answers, without the child's isolation or time bounds."""

    def __init__(self, op: str, file: Path | str, args: tuple = (), fds: tuple[int, ...] = ()) -> None:
        self.file = source_label(file)
        self.settings: list = []
        self.answers = op_answers(op, file, args, None, fds, self.settings)

    def ask(self) -> None:
        """Nothing to ask ahead: an answer is computed when it is taken."""

    def answer(self, media_time: float = 0.0):
        return next(self.answers, None)

    def configure(self, args: tuple) -> None:
        self.settings[:] = args

    def close(self) -> None:
        self.answers.close()


class Decoder:
    """What ffai reads media through: probe a file or live source, load a still, sample frames
    at a rate, or take the frames at given times.

    Each file is read in a child process of its own (``isolated``, the default): a crash inside
    FFmpeg or Pillow on a hostile file (a signal) then kills that child alone and ends in a
    one-line MediaError for that file; a child that stops answering is killed past the time
    bounds (``step_timeout`` per answer, ``file_timeout`` plus ``realtime_factor`` times the
    media time sampled per file, counted in the child's own time: a busy machine slows a child
    without failing its file); a child's memory is capped (MEMORY_LIMIT_BYTES). The cost is
    a fork per file and a pickled copy of each sample. Warnings the child logs reach this
    process's ``ffai.media`` logger.

    ``isolated=False`` runs the same readers in this process, lazily as the caller consumes
    them, with none of the child's bounds: for callers that must see inside (the bench's
    arms, which measure the engine alone; the in-process fuzzer; tests that count decoding).

    A decoder owns the processes it starts: the fork server its children come from (started at
    the first child) and a live source's child a probe left open. ``close()`` (or the end of a
    ``with`` block) ends them; one used again starts a new server. Left open, they end when the
    decoder is collected or the process exits.
    """

    def __init__(
        self,
        step_timeout: float = STEP_TIMEOUT_S,
        file_timeout: float = FILE_TIMEOUT_S,
        realtime_factor: float = REALTIME_FACTOR,
        stall_timeout: float = STALL_TIMEOUT_S,
        isolated: bool = True,
    ) -> None:
        self.bounds = Bounds(step_timeout, file_timeout, realtime_factor, stall_timeout)
        self.isolated = isolated
        self.sandbox = Sandbox()
        # Live sources probed and not yet sampled: their readers, by source name.
        self._live: dict[str, Child | _InProcess] = {}
        self._live_lock = threading.Lock()

    def __enter__(self) -> Decoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the live readers a probe left open and the fork server."""
        with self._live_lock:
            readers, self._live = list(self._live.values()), {}
        for reader in readers:
            reader.close()
        self.sandbox.close()

    def probe(self, path: str | Path) -> MediaInfo:
        """Kind, display size and duration of `path`: headers are read (and a video's first
        frame, which carries the rotation); anything that is not usable media is a MediaError.

        A live source (``is_live``) is opened and read up to its first frame; its reader stays
        open for the ``sample_frames`` that follows (a stream cannot be read twice), until
        another probe of the same source replaces it."""
        if is_live(path):
            return self._open_live(str(path)).info
        return self._one("probe", path)

    def load_image(self, path: str | Path) -> Image.Image:
        """The still image at `path`, upright (EXIF orientation applied), in the mode it was
        read: no colour conversion, so transparency, palettes and 16-bit or float samples reach
        the engine."""
        return self._one("load_image", path)

    def sample_frames(
        self,
        path: str | Path,
        fps: float,
        start: float = 0.0,
        duration: float | None = None,
        max_frames: int | None = None,
    ) -> Iterator[Frame]:
        """Frames of `path` sampled at `fps` on presentation timestamps (``ffai.media``'s rule).

        Arguments and the file's existence are checked now; the file is opened and decoded only
        as the iterator is consumed (in a child, one sample ahead of the caller), and closed
        when it is exhausted or closed. An image gives one frame at time 0.0."""
        check_sampling(fps, start, duration, max_frames)
        args = (fps, start, duration, max_frames)
        if is_live(path):
            return self._frames(lambda: self._live_reader(str(path), args), start)
        file = check_file(path)
        return self._frames(lambda: self._start("sample", file, args), start)

    def frames_at(self, path: str | Path, times: Sequence[float], tolerance: float = 0.0) -> Iterator[Frame]:
        """For each of ``times`` (seconds, ascending), the first frame of the video at `path` at
        or after it, less ``tolerance`` (times stored rounded name a frame up to half a unit
        early); one frame per time, fewer when the video ends first. Decoded lazily in one pass
        from the first time on (in a child, one frame ahead of the caller); only the frames
        given are converted to pictures."""
        times = tuple(times)
        file = check_file(path)
        return self._frames(lambda: self._start("frames_at", file, (times, tolerance)), times[0] if times else 0.0)

    def _start(self, op: str, file: Path | str, args: tuple = (), fds: tuple[int, ...] = ()) -> Child | _InProcess:
        if self.isolated:
            return self.sandbox.child(self.bounds, op, file, args, fds)
        return _InProcess(op, file, args, fds)

    def _one(self, op: str, path: str | Path):
        reader = self._start(op, check_file(path))
        try:
            return reader.answer()
        finally:
            reader.close()

    def _open_live(self, source: str) -> Child | _InProcess:
        if source == STDIN and sys.stdin is not None and sys.stdin.isatty():
            raise MediaError("stdin: is a terminal; pipe a stream into ffai (… | ffai caption -i -)")
        reader = self._start("live", source, fds=(0,) if source == STDIN else ())
        try:
            reader.info = reader.answer()
        except BaseException:
            reader.close()
            raise
        with self._live_lock:
            previous, self._live[source] = self._live.get(source), reader
        if previous is not None:
            previous.close()
        return reader

    def _live_reader(self, source: str, args: tuple) -> Child | _InProcess:
        """The reader a probe left open for `source`, else a new one (its probe answer unused),
        told how to sample."""
        with self._live_lock:
            reader = self._live.pop(source, None)
        if reader is None:
            self._open_live(source)
            with self._live_lock:
                reader = self._live.pop(source)
        reader.configure(args)
        return reader

    def _frames(self, start_reader: Callable[[], Child | _InProcess], start: float) -> Iterator[Frame]:
        reader = start_reader()
        try:
            covered = 0.0
            while (frame := reader.answer(covered)) is not None:
                covered = max(covered, frame.time - start)
                reader.ask()
                yield frame
        finally:
            reader.close()
