"""``Decoder``: probe, load_image, sample_frames and frames_at, each file in a decoder child."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ffai.errors import MediaError
from ffai.media import sandbox
from ffai.media.sandbox import FILE_TIMEOUT_S, REALTIME_FACTOR, STALL_TIMEOUT_S, STEP_TIMEOUT_S, Child
from ffai.media.sources import STDIN, Frame, MediaInfo, check_file, check_sampling, is_live


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
        child = Child(self, op, check_file(path))
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

    def _open_live(self, source: str) -> Child:
        if source == STDIN and sys.stdin is not None and sys.stdin.isatty():
            raise MediaError("stdin: is a terminal; pipe a stream into ffai (… | ffai caption -i -)")
        child = Child(self, "live", source, fds=(0,) if source == STDIN else ())
        try:
            child.info = child.answer()
        except BaseException:
            child.close()
            raise
        with sandbox._live_lock:
            previous, sandbox._live_children[source] = sandbox._live_children.get(source), child
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
        file = check_file(path)
        return self._frames(lambda: Child(self, "sample", file, args), start)

    def _live_child(self, source: str, args: tuple) -> Child:
        """The child a probe left open for `source`, else a new one (its probe answer unused),
        told how to sample."""
        with sandbox._live_lock:
            child = sandbox._live_children.pop(source, None)
        if child is None:
            self._open_live(source)
            with sandbox._live_lock:
                child = sandbox._live_children.pop(source)
        try:
            child.conn.send(("settings", args))
        except OSError:
            raise MediaError(f"{child.file}: the decoder crashed ({child._death()})") from None
        return child

    def frames_at(self, path: str | Path, times: Sequence[float], tolerance: float = 0.0) -> Iterator[Frame]:
        """``frames_at(...)``, decoded in a child one frame ahead of the caller."""
        times = tuple(times)
        file = check_file(path)
        return self._frames(lambda: Child(self, "frames_at", file, (times, tolerance)), times[0] if times else 0.0)

    def _frames(self, start_child: Callable[[], Child], start: float) -> Iterator[Frame]:
        child = start_child()
        try:
            covered = 0.0
            while (frame := child.answer(covered)) is not None:
                covered = max(covered, frame.time - start)
                child.ask()
                yield frame
        finally:
            child.close()
