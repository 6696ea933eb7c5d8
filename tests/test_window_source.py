"""The one window path: what a probed input becomes (items with their cue times and the
engine's request), and answers released in timeline order whatever order they finish in."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from ffai import media
from ffai.run.options import CaptionOptions
from ffai.run.window_source import InOrder, window_items

DEMO_CLIP = Path(__file__).resolve().parents[1] / "examples" / "demo_clip.mp4"


def test_results_are_released_in_order_once_each():
    order = InOrder[str]()
    assert order.add(2, "c") == [] and order.add(1, "b") == []
    assert 2 in order and 0 not in order
    assert order.add(0, "a") == ["a", "b", "c"]
    assert order.add(1, "again") == []  # a window answered twice (Ray's at-least-once) counts once
    assert 1 in order and order.released == 3
    order, out = InOrder[int](), []
    for index, result in [(1, 10), (0, 0), (3, 30), (2, 20)]:
        out += order.add(index, result)
    assert out == [0, 10, 20, 30]


def test_a_files_windows_carry_their_frames_times_and_span():
    options = CaptionOptions(fps=1, window=3)
    decoder = media.Decoder()
    seen: list[float] = []
    items = list(window_items(decoder, decoder.probe(DEMO_CLIP), options, seen.append))
    assert [item.index for item in items] == [0, 1, 2, 3]
    assert seen == [float(t) for t in range(12)]
    for i, item in enumerate(items):
        request = item.request
        assert not request.still and len(request.images) == 3
        assert request.times == (3.0 * i, 3.0 * i + 1, 3.0 * i + 2)
        assert request.span == (3.0 * i, 3.0 * i + 3)
        assert (item.timing.start_ms, item.timing.end_ms, item.timing.text) == (3000 * i, 3000 * i + 3000, "")


def test_a_still_is_one_item(tmp_path):
    path = tmp_path / "still.png"
    Image.new("RGB", (33, 21), (1, 2, 3)).save(path)
    decoder = media.Decoder()
    [item] = window_items(decoder, decoder.probe(path), CaptionOptions(thumbnails=True))
    assert item.index == 0 and item.request.still and item.request.images[0].size == (33, 21)
    assert (item.timing.index, item.timing.start_ms, item.timing.end_ms) == (1, 0, 0)
    assert len(item.timing.thumbnails) == 1
