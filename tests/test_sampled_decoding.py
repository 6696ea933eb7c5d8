"""Decoding only what sampling takes (``frame_sampling.Unsampled`` through ``video.decode``):
the frames no sample takes and nothing references are dropped by the decoder, and every
sample is the same frame, pixel for pixel, as when every frame is decoded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ffai import media
from ffai.media import frame_sampling
from media_fixtures import count_decoded
from sample_media import make_clip, make_vfr_clip, read_frame_index

FPS = 25


def _clip(codec: str, options: dict[str, str]) -> Callable[[Path], Path]:
    return lambda path: make_clip(path, 4.0, FPS, (96, 64), codec=codec, options=options)


# Three B-frames with a B-pyramid: the middle B of a run is a reference, the others are not.
_H264 = ("libx264", _clip("libx264", {"bf": "3", "b-pyramid": "normal", "g": "50"}))

CLIPS = {  # name -> (the encoder it needs, what writes it)
    "h264-b-frames.mp4": _H264,
    "h264-b-frames.ts": _H264,
    "h264-b-frames.avi": _H264,  # AVI stores no pts: FFmpeg's guesses arrive shuffled
    # Open GOPs: frames after a keyframe in decode order that are shown before it (leading
    # pictures) reference the GOP before; x264's recovery points and x265's CRA pictures.
    "h264-open-gop.mkv": (
        "libx264",
        _clip("libx264", {"bf": "3", "x264-params": "open-gop=1:keyint=25:min-keyint=25"}),
    ),
    "hevc.mkv": (
        "libx265",
        _clip(
            "libx265",
            {"preset": "ultrafast", "x265-params": "log-level=error:bframes=4:keyint=25:min-keyint=25:open-gop=1"},
        ),
    ),
    # lag-in-frames lets libvpx code hidden alt-ref frames, which the decoder must still read.
    "vp9.webm": ("libvpx-vp9", _clip("libvpx-vp9", {"auto-alt-ref": "1", "lag-in-frames": "16", "cpu-used": "8"})),
    "mpeg4-b-frames.avi": ("mpeg4", _clip("mpeg4", {"bf": "2"})),
    "vfr-b-frames.mkv": ("libx264", lambda path: make_vfr_clip(path, size=(96, 64), b_frames=3)),
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sampled")
    made = {}
    for name, (encoder, make) in CLIPS.items():
        if media.encoder_available(encoder):
            made[name] = make(folder / name)
    return made


def _samples(path: Path, fps: float, start: float, skip: bool):
    frames = frame_sampling.sample(path, fps, start, None, None, skip_unsampled=skip)
    return [(f.time, f.image.tobytes(), read_frame_index(f.image)) for f in frames]


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """Counts the frames the decoder gives out (one cell)."""
    return count_decoded(monkeypatch)


@pytest.mark.parametrize("name", list(CLIPS))
@pytest.mark.parametrize("fps, start", [(2, 0.0), (0.7, 0.0), (3, 1.3), (7.5, 0.0), (25, 0.5), (60, 0.0), (2, 2.97)])
def test_samples_are_the_frames_a_whole_decode_gives(clips, name, fps, start):
    if name not in clips:
        pytest.skip(f"this PyAV build cannot write {name}")
    skipping = _samples(clips[name], fps, start, skip=True)
    whole = _samples(clips[name], fps, start, skip=False)
    assert [t for t, _, _ in skipping] == [t for t, _, _ in whole]
    assert [i for _, _, i in skipping] == [i for _, _, i in whole]
    assert all(a == b for (_, a, _), (_, b, _) in zip(skipping, whole))  # pixel for pixel


@pytest.mark.parametrize("name", ["h264-b-frames.mp4", "h264-b-frames.ts", "hevc.mkv", "vfr-b-frames.mkv"])
def test_frames_no_sample_takes_are_not_decoded(clips, name, decoded):
    if name not in clips:
        pytest.skip(f"this PyAV build cannot write {name}")
    _samples(clips[name], 2, 0.0, skip=False)
    whole, decoded[0] = decoded[0], 0
    _samples(clips[name], 2, 0.0, skip=True)
    # Every non-reference frame outside the samples is dropped: with B-frames, a good share.
    assert decoded[0] < 0.85 * whole


@pytest.mark.parametrize("name", ["h264-b-frames.avi", "mpeg4-b-frames.avi"])
def test_a_file_without_presentation_times_is_decoded_whole(clips, name, decoded):
    # AVI's packet times are FFmpeg's guesses in decode order: they cannot tell what to drop.
    _samples(clips[name], 2, 0.0, skip=True)
    assert decoded[0] == 4 * FPS


@pytest.mark.parametrize("name", ["h264-open-gop.mkv", "hevc.mkv", "vp9.webm"])
def test_a_run_up_to_the_next_keyframe_is_not_even_sent_to_the_decoder(clips, name, decoded):
    # A keyframe every second, a sample every two: of each two GOPs only the first frames of
    # one are needed; the rest, reference frames included, is never decoded.
    if name not in clips:
        pytest.skip(f"this PyAV build cannot write {name}")
    samples = _samples(clips[name], 0.5, 0.0, skip=True)
    assert len(samples) == 2
    assert decoded[0] < 0.4 * 4 * FPS


def test_at_the_source_rate_every_frame_is_still_decoded(clips, decoded):
    frames = _samples(clips["h264-b-frames.mp4"], FPS, 0.0, skip=True)
    assert len(frames) == decoded[0] == 4 * FPS


def test_the_earliest_frame_of_each_period_is_never_dropped():
    unwanted = frame_sampling.Unsampled(fps=2, start=1.0)
    # Decode order of a B-pyramid: the P at 1.6 first, then the Bs before it.
    assert not unwanted(0.9)  # before start: always decoded
    assert not unwanted(1.6)
    assert not unwanted(1.52)  # earlier than what its period held
    assert unwanted(1.56)  # later than 1.52: not a sample
    assert not unwanted(1.4)  # the period [1.0, 1.5) is new
    assert unwanted(1.44)
    assert not unwanted(1.5)  # a frame exactly on a deadline opens its period


def test_a_damaged_stream_stops_the_skipping(tmp_path, decoded):
    # A clip whose middle packets are garbage: the decoder rejects them, and from there on
    # every frame is decoded again, so samples after the damage are those of a whole decode.
    import av

    source = _H264[1](tmp_path / "clean.mp4")
    damaged = tmp_path / "damaged.mkv"
    with av.open(str(source)) as src, av.open(str(damaged), "w") as dst:
        stream = src.streams.video[0]
        out = dst.add_stream_from_template(stream)
        for n, packet in enumerate(src.demux(stream)):
            if packet.size == 0:
                continue
            if 30 <= n < 33:
                bad = av.Packet(bytes(packet)[:4] + b"\xff" * (packet.size - 4))
                bad.pts, bad.dts, bad.time_base = packet.pts, packet.dts, packet.time_base
                packet = bad
            packet.stream = out
            dst.mux(packet)
    skipping = _samples(damaged, 2, 0.0, skip=True)
    whole = _samples(damaged, 2, 0.0, skip=False)
    assert [(t, i) for t, _, i in skipping] == [(t, i) for t, _, i in whole]
