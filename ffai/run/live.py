"""Live sources: caption a stream as it arrives, keeping up with it or saying what was skipped.

A live source (``ffai.media.is_live``: a pipe, a device, a network URL) runs at its own pace,
whatever the model's. A reader thread takes its samples as they are decoded and groups them
into windows (``ffai.run.windows``: the same timeline rules as a file); the model takes the oldest
waiting window whenever it has room (``max_in_flight``).

How far behind the model is: the *source clock* is the stream time the source has reached,
estimated as the first sample's time plus the wall time since it arrived (a live source runs in
real time), but never past the newest sample read while the source goes on (a source slower
than real time is not counted as ahead of what it sent), and never behind it once it has ended
(the windows still waiting then go on aging, so they too are dropped when too late). A waiting window's *lag* is the source clock minus the
window's end. With ``max_lag`` set, a waiting window whose lag exceeds it is dropped whole,
never in part, when a new window arrives and when the model next has room; consecutive dropped
windows make one ``Dropped`` range, given in timeline order between the cues. Windows already
handed to the model are never dropped, so a cue comes at most ``max_lag`` plus the time of the
windows in flight after its window's last sample. A source faster than real time (a finished
file over HTTP) is not dropped from: its windows wait, at most ``max_lag`` worth of them, and
decoding pauses meanwhile.

With ``max_lag=None`` (``--no-drop``) every window is captioned: one window waits, and
decoding pauses until the model takes it (a pipe's sender blocks; a socket's may lose packets).

When the source ends (end of file, a closed connection) or fails (a stall, a read error), the
windows it delivered are still captioned, the last one with the samples it has; a failure is
raised after them (``LiveWindows.error``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator

from ffai import messages
from ffai.errors import FfaiError, UsageError
from ffai.outputs.cues import Dropped
from ffai.run.windows import TimedFrame, Window, make_windows

# --max-lag's default: more than one default window (8 s at --fps 1 --window 8), so a model that
# keeps up on average never drops, yet one that cannot (SmolVLM-256M on a few cores) stays within
# seconds of the source instead of falling further behind with every window.
DEFAULT_MAX_LAG_S = 10.0


def check_max_lag(max_lag: float | None) -> None:
    """The one rule for ``--max-lag`` (None: ``--no-drop``)."""
    if max_lag is not None and not (math.isfinite(max_lag) and max_lag > 0):
        raise UsageError(f"--max-lag must be a number of seconds > 0, got {max_lag:g}")


class LiveWindows:
    """Windows of a live source as they complete, waiting for the model; drops those that fall
    more than ``max_lag`` seconds behind the source (see the module docstring).

    ``frames`` is iterated on a reader thread of this object's own; ``cond`` guards its state
    and is notified whenever it changes (a window arrived or was dropped, the source ended).
    """

    def __init__(
        self,
        frames: Iterator[TimedFrame],
        size: int,
        fps: float,
        max_lag: float | None,
        *,
        name: str = "the source",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_max_lag(max_lag)
        self.name = name  # for messages
        self.max_lag = max_lag
        self.cond = threading.Condition()
        self.ended = False
        self.error: BaseException | None = None  # why the source ended early, raised after its windows
        self.dropped_windows = 0
        self.dropped_seconds = 0.0
        self._clock = clock
        self._frames = frames
        self._size, self._fps = size, fps
        self._waiting: deque[Window] = deque()
        self._drops: list[Dropped] = []  # closed ranges, for take()
        self._open_drop: Dropped | None = None  # the range still growing (no window taken since)
        # How many windows may wait: without dropping, one (decoding then pauses); with it, one
        # more than max_lag can hold, so that a real-time source's oldest window is dropped
        # before the reader would pause (a paused reader stops the source clock, and nothing
        # would ever be late), while a source faster than real time cannot fill memory either.
        self._capacity = 1 if max_lag is None else math.ceil(max_lag * fps / size) + 2
        self._anchor: tuple[float, float] | None = None  # (first sample's time, its wall time)
        self._newest = -math.inf
        self._stopping = False
        self._thread = threading.Thread(target=self._read, name="ffai-live-reader", daemon=True)

    def start(self) -> LiveWindows:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop reading; the reader closes the source when it next wakes."""
        with self.cond:
            self._stopping = True
            self.cond.notify_all()

    # -- the source clock -------------------------------------------------------------------

    def source_time(self) -> float:
        """The stream time the source has reached (-inf before its first sample): it runs in
        real time from the first sample, never ahead of the newest sample while the source goes
        on, and never behind it once the source has ended (its last windows still age)."""
        if self._anchor is None:
            return -math.inf
        first, wall = self._anchor
        real_time = first + (self._clock() - wall)
        return max(real_time, self._newest) if self.ended else min(real_time, self._newest)

    def lag(self, stream_time: float) -> float:
        """How far the source is past ``stream_time``, in seconds (0 before the first sample)."""
        return max(0.0, self.source_time() - stream_time) if self._anchor is not None else 0.0

    # -- the model's side (call with cond held) ---------------------------------------------

    def take(self) -> tuple[list[Dropped], Window | None]:
        """The dropped ranges that come before the next window, and that window (None when none
        waits). Call with ``cond`` held."""
        self._drop_late()
        window = self._waiting.popleft() if self._waiting else None
        if window is not None or self.ended:
            self._close_drop()
        drops, self._drops = self._drops, []
        self.cond.notify_all()  # room for the reader
        return drops, window

    @property
    def exhausted(self) -> bool:
        """The source ended and every window and dropped range was taken."""
        return self.ended and not self._waiting and not self._drops and self._open_drop is None

    # -- the reader ---------------------------------------------------------------------------

    def _samples(self) -> Iterator[TimedFrame]:
        try:
            for frame in self._frames:
                with self.cond:
                    if self._anchor is None:
                        self._anchor = (frame.time, self._clock())
                    self._newest = frame.time
                yield frame
        except FfaiError as e:  # the source failed: the samples so far still make windows
            self.error = e

    def _read(self) -> None:
        try:
            for window in make_windows(self._samples(), self._size, self._fps):
                with self.cond:
                    self._waiting.append(window)
                    self._drop_late()
                    self.cond.notify_all()
                    while len(self._waiting) >= self._capacity and not self._stopping:
                        self.cond.wait()
                    if self._stopping:
                        return
        except BaseException as e:  # raised on the model's side, after the windows so far
            self.error = e
        finally:
            close = getattr(self._frames, "close", None)
            if close is not None:
                close()
            with self.cond:
                self.ended = True
                self.cond.notify_all()

    def _drop_late(self) -> None:
        """Drop waiting windows that lag by more than max_lag, oldest first; never the newest
        while the source goes on (it has only just completed)."""
        if self.max_lag is None:
            return
        while self._waiting and (len(self._waiting) > 1 or self.ended):
            window = self._waiting[0]
            if self.lag(window.end) <= self.max_lag:
                return
            self._waiting.popleft()
            self.dropped_windows += 1
            self.dropped_seconds += window.end - window.start
            start_ms, end_ms = round(window.start * 1000), round(window.end * 1000)
            if self._open_drop is None:
                self._open_drop = Dropped(start_ms, end_ms, 1)
            else:
                d = self._open_drop
                self._open_drop = Dropped(d.start_ms, end_ms, d.windows + 1)

    def _close_drop(self) -> None:
        if self._open_drop is not None:
            self._drops.append(self._open_drop)
            self._open_drop = None


@dataclass
class _Slot:
    """A window handed to the model, in timeline order with the dropped ranges."""

    window: Window
    future: Any = None  # the pipeline's future, once submitted


def live_answers(
    windows: LiveWindows,
    submit: Callable[[Hashable, Window, Callable[[Any], None] | None], Any],
    abort: Callable[[Hashable], Any],
    max_in_flight: int,
    on_chunk: Callable[[Hashable, Any], None] | None = None,
) -> Iterator[tuple[Window, Any] | Dropped]:
    """``(window, answer)`` for each window the model captioned and ``Dropped`` for each range
    it skipped, in timeline order, each as soon as it and everything before it is done.

    ``submit(request_id, window, chunk_sink)`` hands a window to the pipeline and returns its
    future (``chunk_sink``, when not None, takes the request's stream chunks on any thread);
    ``on_chunk(request_id, chunk)`` is then called here, on the iterating thread. Leaving the
    loop early aborts the windows in flight and stops the reader. The source's failure, if
    any, is raised after everything it delivered.
    """
    cond = windows.cond
    order: deque[_Slot | Dropped] = deque()
    chunks: deque[tuple[Hashable, Any]] = deque()

    def wake(*_: object) -> None:
        with cond:
            cond.notify_all()

    def sink_for(request_id: Hashable) -> Callable[[Any], None] | None:
        if on_chunk is None:
            return None

        def sink(chunk: Any) -> None:
            with cond:
                chunks.append((request_id, chunk))
                cond.notify_all()

        return sink

    def head_ready() -> bool:
        head = order[0] if order else None
        return isinstance(head, Dropped) or (head is not None and head.future is not None and head.future.done())

    windows.start()
    try:
        while True:
            ready: list[_Slot | Dropped] = []
            new: _Slot | None = None
            with cond:
                while True:
                    pieces = list(chunks)
                    chunks.clear()
                    in_flight = sum(isinstance(s, _Slot) and not (s.future and s.future.done()) for s in order)
                    if in_flight < max_in_flight:
                        drops, window = windows.take()
                        order.extend(drops)
                        if window is not None:
                            new = _Slot(window)
                            order.append(new)
                    while head_ready():
                        ready.append(order.popleft())
                    if pieces or ready or new is not None:
                        break
                    if windows.exhausted and not order:
                        break
                    cond.wait()
            for request_id, chunk in pieces:
                on_chunk(request_id, chunk)
            for item in ready:
                yield item if isinstance(item, Dropped) else (item.window, item.future.result())
            if new is not None:
                new.future = submit(new.window.index, new.window, sink_for(new.window.index))
                new.future.add_done_callback(wake)
            elif not pieces and not ready:
                break
        if windows.dropped_windows:
            messages.warn(
                f"{windows.name}: dropped {windows.dropped_windows} window(s), {windows.dropped_seconds:.1f} s of the "
                f"stream, to keep within --max-lag {windows.max_lag:g} s (json/jsonl tracks list them)"
            )
        if windows.error is not None:
            raise windows.error
    finally:
        windows.close()
        for item in order:
            if isinstance(item, _Slot) and item.future is not None and not item.future.done():
                abort(item.window.index)
