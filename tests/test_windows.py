"""Timeline rules of ffai.run.windows (DESIGN §2), checked as properties over seeded random clips."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from ffai.errors import UsageError
from ffai.run.windows import Window, make_windows


@dataclass(frozen=True)
class FakeFrame:
    time: float
    image: object = None


def random_clip(rng: random.Random) -> tuple[list[FakeFrame], float, float | None]:
    """Frames at variable intervals (as sampling a VFR clip gives), an fps and maybe a clip end."""
    fps = rng.choice([0.5, 1.0, 2.0, 3.0, 29.97])
    t = rng.uniform(0, 5)
    frames = []
    for _ in range(rng.randint(0, 40)):
        frames.append(FakeFrame(round(t, 6)))
        t += rng.uniform(0.5, 1.5) / fps
    clip_end = None
    if frames and rng.random() < 0.6:
        clip_end = frames[-1].time + rng.uniform(-0.2, 2.0) / fps  # before, inside or past last + 1/fps
    return frames, fps, clip_end


def expected_last_end(last: float, fps: float, clip_end: float | None) -> float:
    end = last + 1 / fps
    return end if clip_end is None else max(last, min(end, clip_end))


@pytest.mark.parametrize("seed", range(300))
def test_windows_tile_the_timeline(seed):
    rng = random.Random(seed)
    frames, fps, clip_end = random_clip(rng)
    size = rng.randint(1, 9)
    windows = list(make_windows(iter(frames), size, fps, clip_end))

    # every frame once, in order, in windows of `size` with only the last one shorter
    assert [f for w in windows for f in w.frames] == frames
    assert len(windows) == math.ceil(len(frames) / size)
    assert [w.index for w in windows] == list(range(len(windows)))
    assert all(len(w.frames) == size for w in windows[:-1])
    if windows:
        assert 1 <= len(windows[-1].frames) <= size
        assert len(windows[-1].frames) == len(frames) - size * (len(windows) - 1)  # remainder kept

    for w in windows:
        assert w.start == w.frames[0].time
        assert w.frame_times == tuple(f.time for f in w.frames)
        assert w.start <= w.end
    for w, nxt in zip(windows, windows[1:]):
        assert w.end == nxt.start  # no gap, no overlap
    if windows:
        assert windows[-1].end == expected_last_end(frames[-1].time, fps, clip_end)


@pytest.mark.parametrize("seed", range(50))
def test_size_one_is_per_frame(seed):
    frames, fps, clip_end = random_clip(random.Random(seed))
    windows = list(make_windows(frames, 1, fps, clip_end))
    assert [w.frames for w in windows] == [(f,) for f in frames]
    assert [w.start for w in windows] == [f.time for f in frames]
    assert [w.end for w in windows[:-1]] == [f.time for f in frames[1:]]


def test_exact_example():
    frames = [FakeFrame(t) for t in (0.0, 0.5, 1.0, 1.5, 2.0)]
    windows = list(make_windows(frames, 2, 2.0))
    assert [(w.index, w.frame_times, w.start, w.end) for w in windows] == [
        (0, (0.0, 0.5), 0.0, 1.0),
        (1, (1.0, 1.5), 1.0, 2.0),
        (2, (2.0,), 2.0, 2.5),
    ]
    assert isinstance(windows[0], Window)


def test_last_end_is_clamped_to_the_clip_end():
    frames = [FakeFrame(0.0), FakeFrame(1.0)]
    assert list(make_windows(frames, 1, 1.0, clip_end=1.4))[-1].end == 1.4
    assert list(make_windows(frames, 1, 1.0, clip_end=9.0))[-1].end == 2.0
    # a container duration shorter than the last timestamp never gives a negative cue
    assert list(make_windows(frames, 1, 1.0, clip_end=0.5))[-1].end == 1.0


def test_empty_input_gives_no_windows():
    assert list(make_windows(iter(()), 3, 1.0)) == []
    assert list(make_windows([], 1, 1.0, clip_end=10.0)) == []


@pytest.mark.parametrize("size, fps", [(0, 1.0), (-1, 1.0), (1, 0.0), (1, -2.0), (1, math.nan), (1, math.inf)])
def test_bad_arguments_raise_at_the_call(size, fps):
    def never_read():
        raise AssertionError("frames must not be read before the arguments are checked")
        yield  # pragma: no cover

    with pytest.raises(UsageError, match="--window" if size < 1 else "--fps"):
        make_windows(never_read(), size, fps)


def test_times_going_backwards_are_refused():
    frames = [FakeFrame(0.0), FakeFrame(1.0), FakeFrame(0.5)]
    with pytest.raises(ValueError, match="must not decrease"):
        list(make_windows(frames, 1, 1.0))


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("k", [1, 2, 3, 7, 10])
def test_lazy_windows_come_before_a_failing_frame(size, k):
    """A window needs its frames plus one look-ahead frame; nothing more is read."""
    pulled = []

    def frames():
        for i in range(k):
            pulled.append(i)
            yield FakeFrame(float(i))
        raise RuntimeError("decoder failed")

    windows = make_windows(frames(), size, 1.0)
    expected = (k - 1) // size  # windows whose look-ahead frame index (w + 1) * size < k
    for w in range(expected):
        window = next(windows)
        assert window.frame_times == tuple(float(i) for i in range(w * size, (w + 1) * size))
        assert len(pulled) == (w + 1) * size + 1  # the window's frames + one look-ahead
    with pytest.raises(RuntimeError, match="decoder failed"):
        next(windows)


def test_an_endless_stream_is_windowed_incrementally():
    def forever():
        t = 0.0
        while True:
            yield FakeFrame(t)
            t += 0.25

    windows = make_windows(forever(), 4, 4.0)
    first = [next(windows) for _ in range(3)]
    assert [w.start for w in first] == [0.0, 1.0, 2.0]
    assert [w.end for w in first] == [1.0, 2.0, 3.0]
