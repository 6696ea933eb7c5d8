"""The one window path: a probed input turned into what the engine is asked, and the answers
put back in timeline order.

decode (``media.Decoder``, sampled as ``CaptionOptions`` say) → windows (``ffai.run.windows``) →
``WindowItem`` s (a cue's times and the engine's ``Request``) → answers, which may finish out
of order, released in order by ``InOrder``. A local run (``ffai.run.captioner``), a live source
(``ffai.run.live`` groups its frames into windows as they arrive, then each becomes an item here)
and Ray (``ffai.ray.workers`` decodes on the cluster, ``ffai.ray.backend`` orders the answers)
all go through these functions, so they ask the engine the same things.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, Iterator, TypeVar

from ffai import media
from ffai.engines.contract import Answer, Request
from ffai.outputs.cues import Cue
from ffai.outputs.thumbnails import still_thumbnail, window_thumbnails
from ffai.run.options import CaptionOptions
from ffai.run.windows import Window, make_windows

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image


T = TypeVar("T")


@dataclass(frozen=True)
class WindowItem:
    """One window (or a still) as decoded: where its cue goes and what the engine is asked."""

    index: int  # 0-based position in its input; a still is window 0
    timing: Cue  # the cue with its times (and thumbnails), text still empty
    request: Request
    decode_s: float = 0.0  # seconds spent decoding it


def frames(
    decoder: media.Decoder,
    info: media.MediaInfo,
    options: CaptionOptions,
    on_frame: Callable[[float], None] | None = None,
) -> Iterator[media.Frame]:
    """The input's samples as ``options`` ask (fps, -ss, -t, --max-frames), each time reported
    to ``on_frame`` as it is decoded."""
    o = options
    for frame in decoder.sample_frames(info.path, o.fps, start=o.start, duration=o.duration, max_frames=o.max_frames):
        if on_frame:
            on_frame(frame.time)
        yield frame


def window_items(
    decoder: media.Decoder,
    info: media.MediaInfo,
    options: CaptionOptions,
    on_frame: Callable[[float], None] | None = None,
) -> Iterator[WindowItem]:
    """A still as one item, or a file's windows in timeline order, decoded lazily: at most one
    window (and the frame after it) is held here. Live sources go through ``ffai.run.live``."""
    clock = time.perf_counter()
    if info.kind == "image":
        image = decoder.load_image(info.path)
        timing = still_cue_timing(image if options.thumbnails else None)
        yield WindowItem(0, timing, Request((image,), options.decoding), time.perf_counter() - clock)
        return
    for window in make_windows(frames(decoder, info, options, on_frame), options.window, options.fps, info.duration):
        yield window_item(window, options, time.perf_counter() - clock)
        clock = time.perf_counter()


def window_item(window: Window, options: CaptionOptions, decode_s: float = 0.0) -> WindowItem:
    return WindowItem(
        window.index, window_cue_timing(window, options.thumbnails), window_request(window, options), decode_s
    )


def window_request(window: Window, options: CaptionOptions) -> Request:
    """What the engine is asked about one window: its frames, their source times and its span."""
    images = tuple(frame.image for frame in window.frames)
    return Request.frames(images, window.frame_times, options.decoding, span=(window.start, window.end))


def window_cue_timing(window: Window, thumbnails: bool = False) -> Cue:
    """A window's cue before its text is known; with ``thumbnails``, pictures of its frames
    (``ffai.outputs.thumbnails``), made here where the frames are, so no frame outlives its window."""
    shots = window_thumbnails(window.frames) if thumbnails else ()
    return dataclasses.replace(Cue.from_window(window, ""), thumbnails=shots)


def still_cue_timing(thumbnail_of: "Image.Image | None" = None) -> Cue:
    """A still's one cue, at 0, before its text is known; with its picture when
    ``thumbnail_of`` is the still (for the contact sheet)."""
    shots = (still_thumbnail(thumbnail_of),) if thumbnail_of is not None else ()
    return Cue(index=1, start_ms=0, end_ms=0, frame_times_ms=(0,), text="", thumbnails=shots)


def answered_cue(timing: Cue, answer: Answer) -> Cue:
    """The cue with the answer's text, surrounding whitespace stripped, and its tokens."""
    return dataclasses.replace(timing, text=answer.text.strip(), token_ids=answer.token_ids)


class InOrder(Generic[T]):
    """Results of windows 0, 1, 2 ... that finish in any order, released in index order: each
    as soon as every window before it is out. Holds only those that wait for an earlier one."""

    def __init__(self) -> None:
        self.released = 0  # windows 0 .. released - 1 are out
        self._held: dict[int, T] = {}

    def __contains__(self, index: int) -> bool:
        """Whether window ``index`` has a result already (out, or waiting for its turn)."""
        return index < self.released or index in self._held

    def add(self, index: int, result: T) -> list[T]:
        """Record ``result`` for window ``index``; the results now due, in order."""
        if index not in self:
            self._held[index] = result
        due = []
        while self.released in self._held:
            due.append(self._held.pop(self.released))
            self.released += 1
        return due
