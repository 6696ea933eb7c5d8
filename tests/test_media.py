"""ffai.media: probing, image loading and timestamp sampling, against clips written by
scripts/sample_media.py and timestamps read back independently with PyAV."""

from __future__ import annotations

import logging
import pickle
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from ffai import media
from ffai.errors import MediaError, UsageError
from media_fixtures import count_decoded, decoded_times, expected_sample_times
from sample_media import (
    CORNERS,
    make_10bit_clip,
    make_audio_only,
    make_clip,
    make_odd_size_clip,
    make_rotated_clip,
    make_truncated_mp4,
    make_vfr_clip,
    make_zero_frame_clip,
    read_frame_index,
    vfr_times_ms,
)

CFR_FPS = 25
# Read in this process: the tests patch and count what it decodes, with no child in between.
here = media.Decoder(isolated=False)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("media")
    return {
        "cfr": make_clip(d / "cfr.mp4", 4.0, CFR_FPS),
        "vfr": make_vfr_clip(d / "vfr.mp4"),
        "ts": make_clip(d / "cfr.ts", 4.0, CFR_FPS),
    }


def times_of(frames) -> list[float]:
    return [f.time for f in frames]


# ---------------------------------------------------------------------------- sampling


@pytest.mark.parametrize(
    "fps, start, duration, max_frames",
    [
        (2, 0.0, None, None),
        (25, 0.0, None, None),  # the source rate: every frame once
        (60, 0.0, None, None),  # above the source rate: still every frame once, no duplicates
        (3, 1.3, 1.0, None),
        (1, 1.97, None, None),  # just after a keyframe's decode time, before its display time
        (7, 0.5, None, 5),
        (0.4, 0.0, 3.5, None),
    ],
)
def test_cfr_sampling_follows_decoder_timestamps(clips, fps, start, duration, max_frames):
    times = decoded_times(clips["cfr"])
    assert len(times) == 100
    frames = list(here.sample_frames(clips["cfr"], fps, start, duration, max_frames))
    assert times_of(frames) == expected_sample_times(times, fps, start, duration, max_frames)
    for frame in frames:
        # The picture is the one stamped with that time, not a neighbour.
        assert read_frame_index(frame.image) == round(frame.time * CFR_FPS)
        assert frame.image.mode == "RGB" and frame.image.size == (64, 48)


@pytest.mark.parametrize("fps", [1, 3, 10, 50])
def test_vfr_sampling_follows_decoder_timestamps(clips, fps):
    source_ms = vfr_times_ms()
    times = decoded_times(clips["vfr"])
    assert times == pytest.approx([ms / 1000 for ms in source_ms])
    frames = list(here.sample_frames(clips["vfr"], fps))
    got = times_of(frames)
    assert got == expected_sample_times(times, fps)
    assert got == sorted(set(got))  # strictly increasing: no frame twice
    for frame in frames:
        assert read_frame_index(frame.image) == source_ms.index(round(frame.time * 1000))


def test_vfr_holds_use_up_deadlines(clips):
    # Worked by hand at 10 fps: 0.33 serves deadlines 0.2 and 0.3, 0.645 serves 0.4-0.6,
    # 1.325 serves 0.9-1.3, 2.185 serves 1.8-2.1; frames inside a burst (0.04, 0.05) are dropped.
    got = times_of(here.sample_frames(clips["vfr"], 10))
    assert got == [0.0, 0.13, 0.33, 0.645, 0.725, 0.825, 1.325, 1.635, 1.785, 2.185, 2.245]


# MPEG-TS seeks land after the target almost always: the sampler must step back and still
# start exactly.
@pytest.mark.parametrize("container", ["cfr", "ts"])
@pytest.mark.parametrize("start", [0.04, 0.05, 1.0, 1.3, 1.97, 2.29, 2.5, 3.96, 3.97, 4.5])
def test_start_is_exact(clips, container, start):
    times = decoded_times(clips[container])
    frames = list(here.sample_frames(clips[container], 100, start=start, max_frames=2))
    after = [t for t in times if t >= start - 1e-6]
    assert times_of(frames) == after[:2]
    assert [read_frame_index(f.image) for f in frames] == [round(t * CFR_FPS) for t in after[:2]]


@pytest.mark.skipif(not media.encoder_available("libx264"), reason="needs libx264 for B-frames")
def test_avi_with_b_frames_comes_out_in_display_order(tmp_path):
    # AVI stores no pts: with B-frames the decoder's pts arrive shuffled (1, 3, 4, 2, ...) and
    # the best-effort guess falls back on the dts, as ffmpeg does.
    clip = make_clip(tmp_path / "b.avi", 4.0, CFR_FPS, codec="libx264")
    with av.open(str(clip)) as container:
        raw = [frame.pts for frame in container.decode(video=0)]
    assert raw != sorted(raw)
    frames = list(here.sample_frames(clip, CFR_FPS))
    indices = [read_frame_index(f.image) for f in frames]
    assert indices == sorted(set(indices)) and len(indices) >= 95
    assert times_of(frames) == sorted(set(times_of(frames)))
    # Seeks in AVI can land a frame late; a later start still picks the same frame as a full run.
    for start in [0.02, 0.5, 1.0, 1.3, 2.29, 3.5]:
        first = next(here.sample_frames(clip, 100, start=start))
        full = next(f for f in frames if f.time >= start - 1e-6)
        assert (first.time, read_frame_index(first.image)) == (full.time, read_frame_index(full.image))


def test_start_seeks_instead_of_decoding_from_zero(clips, monkeypatch):
    decoded = count_decoded(monkeypatch)
    frames = list(here.sample_frames(clips["cfr"], 5, start=3.0))
    assert frames[0].time == pytest.approx(3.0)
    # Keyframes every second: the seek lands at 3.0 s, so about 25 frames, not 100.
    assert decoded[0] <= 40


def test_duration_bounds_the_segment(clips):
    frames = list(here.sample_frames(clips["cfr"], CFR_FPS, start=1.0, duration=1.0))
    assert times_of(frames) == pytest.approx([1.0 + i / CFR_FPS for i in range(25)])


def test_max_frames(clips):
    assert len(list(here.sample_frames(clips["cfr"], 5, max_frames=3))) == 3
    with pytest.raises(UsageError, match="--max-frames"):  # the CLI's rule: at least 1
        here.sample_frames(clips["cfr"], 5, max_frames=0)


def test_times_start_at_zero_when_the_stream_does_not(clips):
    with av.open(str(clips["ts"])) as container:
        assert container.streams.video[0].start_time > 0  # MPEG-TS offsets its timestamps
    frames = list(here.sample_frames(clips["ts"], CFR_FPS))
    assert frames[0].time == 0.0
    assert times_of(frames) == pytest.approx([i / CFR_FPS for i in range(100)])


def test_sampling_is_lazy(tmp_path, monkeypatch):
    clip = make_clip(tmp_path / "long.mp4", 20.0, CFR_FPS)
    decoded = count_decoded(monkeypatch)
    frames = here.sample_frames(clip, 1)
    assert decoded[0] == 0  # nothing opened or decoded before the first next()
    first, second = next(frames), next(frames)
    assert (first.time, second.time) == (0.0, 1.0)
    frames.close()
    # The second sample is frame 25: at most it and those before it (fewer: frames no sample
    # takes are dropped), plus the decoder's delay; never the other 475.
    assert 2 <= decoded[0] <= 40


def test_bad_sampling_arguments_are_refused_up_front(clips):
    for kwargs, flag in [
        ({"fps": 0}, "--fps"),
        ({"fps": float("nan")}, "--fps"),
        ({"fps": 1, "start": -1}, "-ss"),
        ({"fps": 1, "duration": 0}, "-t"),
        ({"fps": 1, "max_frames": -1}, "--max-frames"),
    ]:
        with pytest.raises(UsageError, match=flag):
            here.sample_frames(clips["cfr"], **kwargs)


# ---------------------------------------------------------------------------- special videos


def corner(image: Image.Image, where: str) -> tuple[int, ...]:
    """The pixel 3 px inside one corner (the corner cells are 8x8 at 64x48)."""
    x = 3 if "left" in where else image.width - 4
    y = 3 if "top" in where else image.height - 4
    return image.getpixel((x, y))


def assert_colour(pixel, expected, tolerance=48):
    assert max(abs(int(a) - int(b)) for a, b in zip(pixel, expected)) <= tolerance, (pixel, expected)


def test_odd_size_is_preserved(tmp_path):
    clip = make_odd_size_clip(tmp_path / "odd.mp4")
    info = here.probe(clip)
    assert (info.kind, info.width, info.height) == ("video", 641, 359)
    frames = list(here.sample_frames(clip, 5))
    assert [f.image.size for f in frames] == [(641, 359)] * 5
    assert [read_frame_index(f.image) for f in frames] == [0, 2, 4, 6, 8]


@pytest.mark.parametrize(
    "rotation, moved",
    [
        # counter-clockwise quarter turn: top-left goes to bottom-left, top-right to top-left
        (90, {"bottom_left": "top_left", "top_left": "top_right", "bottom_right": "bottom_left"}),
        # clockwise quarter turn (the usual phone portrait matrix)
        (-90, {"top_right": "top_left", "bottom_right": "top_right", "top_left": "bottom_left"}),
        (180, {"bottom_right": "top_left", "bottom_left": "top_right", "top_right": "bottom_left"}),
    ],
)
def test_rotation_is_applied(tmp_path, rotation, moved):
    clip = make_rotated_clip(tmp_path / "rotated.mp4", rotation)
    info = here.probe(clip)
    expected_size = (64, 48) if rotation == 180 else (48, 64)
    assert (info.width, info.height) == expected_size
    frames = list(here.sample_frames(clip, 10))
    assert len(frames) == 10
    undo = {90: Image.Transpose.ROTATE_270, -90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180}
    for frame in frames:
        assert frame.image.size == expected_size
        for now, was in moved.items():
            assert_colour(corner(frame.image, now), CORNERS[was])
        assert read_frame_index(frame.image.transpose(undo[rotation])) == round(frame.time * 10)


def test_10bit_decodes_to_rgb8(tmp_path):
    clip = make_10bit_clip(tmp_path / "10bit.mp4")
    with av.open(str(clip)) as container:
        assert container.streams.video[0].codec_context.format.name == "yuv420p10le"
    frames = list(here.sample_frames(clip, 10))
    assert len(frames) == 10
    for i, frame in enumerate(frames):
        pixels = np.asarray(frame.image)
        assert pixels.dtype == np.uint8 and pixels.shape == (48, 64, 3)
        assert read_frame_index(frame.image) == i
        assert_colour(corner(frame.image, "top_left"), CORNERS["top_left"])
        shade = 64 + (i * 7) % 128  # the background grey of frame i (draw_frame)
        assert_colour(frame.image.getpixel((36, 3)), (shade, shade, shade), tolerance=8)


def test_zero_frame_video_yields_nothing(tmp_path):
    clip = make_zero_frame_clip(tmp_path / "empty.mkv")
    info = here.probe(clip)
    assert (info.kind, info.width, info.height) == ("video", 64, 48)
    assert list(here.sample_frames(clip, 1)) == []


def test_cut_off_file_stops_at_the_cut(tmp_path, caplog):
    clip = make_truncated_mp4(tmp_path / "cut.mp4", faststart=True)
    with caplog.at_level(logging.WARNING, logger="ffai.media"):
        frames = list(here.sample_frames(clip, CFR_FPS))
    got = times_of(frames)
    assert 10 < len(got) < 200 and got == sorted(set(got))
    assert all(read_frame_index(f.image) == round(f.time * CFR_FPS) for f in frames)
    assert "failed to decode" in caplog.text


# ---------------------------------------------------------------------------- errors


def png_header(width: int, height: int) -> bytes:
    """A PNG with the given header size and no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


BAD_INPUTS = {
    "missing": lambda d: d / "missing.mp4",
    "directory": lambda d: d,
    "empty": lambda d: _write(d / "empty.mp4", b""),
    "text named .mp4": lambda d: _write(d / "notes.mp4", b"not a video, just words\n" * 40),
    "audio only": lambda d: make_audio_only(d / "audio.mp4"),
    "truncated mp4": lambda d: make_truncated_mp4(d / "cut.mp4"),
    "zero-size image": lambda d: _write(d / "zero.png", png_header(0, 10)),
    "too wide image": lambda d: _write(d / "wide.png", png_header(20000, 10)),
    "decompression bomb": lambda d: _write(d / "bomb.png", png_header(20000, 20000)),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs_raise_media_error_naming_the_path(tmp_path, name):
    path = BAD_INPUTS[name](tmp_path)
    with pytest.raises(MediaError) as probed:
        here.probe(path)
    assert str(path) in str(probed.value) and "\n" not in str(probed.value)
    with pytest.raises(MediaError) as sampled:
        list(here.sample_frames(path, 1))
    assert str(path) in str(sampled.value)


def test_undecodable_payload(tmp_path, caplog):
    clip = make_clip(tmp_path / "garbage.mp4", 1.0, CFR_FPS)
    data = bytearray(clip.read_bytes())
    # Keep the index (moov, at the end) and scramble every sample in mdat.
    first, last = data.index(b"mdat") + 4, data.index(b"moov") - 4
    data[first:last] = np.random.default_rng(0).integers(0, 256, last - first, np.uint8).tobytes()
    clip.write_bytes(bytes(data))
    with pytest.raises(MediaError, match="none of the 25 video frames could be decoded"):
        here.probe(clip)
    with caplog.at_level(logging.WARNING, logger="ffai.media"):
        assert list(here.sample_frames(clip, 1)) == []
    assert "skipped 25 video packet(s)" in caplog.text


def test_audio_only_says_so(tmp_path):
    with pytest.raises(MediaError, match="no video stream"):
        here.probe(make_audio_only(tmp_path / "audio.mp4"))


def test_load_image_refuses_video(clips):
    with pytest.raises(MediaError, match="not an image"):
        here.load_image(clips["cfr"])


def test_truncated_image_is_a_media_error(tmp_path):
    whole = tmp_path / "whole.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(whole)
    cut = _write(tmp_path / "cut.jpg", whole.read_bytes()[:600])
    with pytest.raises(MediaError, match="cut.jpg"):
        here.load_image(cut)


# ---------------------------------------------------------------------------- images


def save(image: Image.Image, path: Path, **kwargs) -> Path:
    image.save(path, **kwargs)
    return path


def test_kind_comes_from_content_not_extension(tmp_path, clips):
    png_named_mp4 = save(Image.new("RGB", (30, 20), (1, 2, 3)), tmp_path / "picture.mp4", format="PNG")
    mp4_named_png = _write(tmp_path / "movie.png", clips["cfr"].read_bytes())
    assert here.probe(png_named_mp4) == media.MediaInfo(png_named_mp4, "image", 30, 20, None)
    assert here.probe(mp4_named_png).kind == "video"
    assert here.load_image(png_named_mp4).getpixel((0, 0)) == (1, 2, 3)


def _same_image(loaded: Image.Image, path: Path) -> None:
    """`loaded` is what Pillow reads from `path`: mode, size, samples, palette, transparency."""
    with Image.open(path) as opened:
        assert (loaded.mode, loaded.size) == (opened.mode, opened.size)
        assert loaded.tobytes() == opened.tobytes()
        assert loaded.getpalette() == opened.getpalette()
        assert loaded.info.get("transparency") == opened.info.get("transparency")


def _palette_with_transparency(path: Path) -> Path:
    image = Image.new("P", (24, 16), 1)
    image.putpalette([0, 0, 0, 200, 100, 50, 10, 250, 10] + [0] * 759)
    image.paste(2, (0, 0, 8, 8))
    image.save(path, transparency=bytes([255, 0, 128]))  # a tRNS chunk: entry 1 hidden, 2 half
    return path


@pytest.mark.parametrize(
    "mode, value, fmt",
    [
        ("RGBA", (10, 20, 30, 0), "PNG"),
        ("LA", (90, 0), "PNG"),
        ("L", 77, "PNG"),
        ("1", 1, "PNG"),
        ("CMYK", (0, 255, 255, 0), "TIFF"),
        ("CMYK", (0, 255, 255, 0), "JPEG"),
        ("I;16", 65535, "PNG"),
        ("I;16", 32896, "TIFF"),
        ("I", 32896, "TIFF"),
        ("F", 0.5, "TIFF"),
    ],
)
def test_images_keep_the_mode_they_were_read_in(tmp_path, mode, value, fmt):
    """No colour conversion in the media layer: the engine converts once, as its reference does."""
    path = save(Image.new(mode, (24, 16), value), tmp_path / f"image.{fmt.lower()}", format=fmt)
    image = here.load_image(path)
    _same_image(image, path)
    assert image.mode == mode
    assert here.probe(path) == media.MediaInfo(path, "image", 24, 16, None)
    assert [(f.time, f.image.mode) for f in here.sample_frames(path, 1)] == [(0.0, image.mode)]


def test_palette_image_keeps_its_palette_and_transparency(tmp_path):
    path = _palette_with_transparency(tmp_path / "p.png")
    loaded = here.load_image(path)
    _same_image(loaded, path)
    assert (loaded.mode, loaded.info["transparency"]) == ("P", bytes([255, 0, 128]))


def test_16bit_and_float_samples_arrive_unchanged(tmp_path):
    ramp = np.linspace(0, 65535, 64, dtype=np.float64).round().astype(np.uint16)[None, :].repeat(4, 0)
    image = here.load_image(save(Image.fromarray(ramp), tmp_path / "ramp.png"))
    assert image.mode == "I;16" and np.array_equal(np.asarray(image), ramp)
    values = np.array([[-2.0, 0.0, 0.5, 2.0]], np.float32)
    image = here.load_image(save(Image.fromarray(values, "F"), tmp_path / "f.tiff"))
    assert image.mode == "F" and np.array_equal(np.asarray(image), values)


def test_a_still_survives_the_trip_to_a_worker(tmp_path):
    """Stages in worker processes get a still by pickling (the pipeline's ForkingPickler): its
    mode, palette and transparency must arrive, or the engine's conversion would differ."""
    from multiprocessing.reduction import ForkingPickler

    loaded = here.load_image(_palette_with_transparency(tmp_path / "p.png"))
    arrived = pickle.loads(ForkingPickler.dumps(loaded))
    assert (arrived.mode, arrived.info, arrived.getpalette()) == (loaded.mode, loaded.info, loaded.getpalette())
    assert arrived.convert("RGBA").tobytes() == loaded.convert("RGBA").tobytes()


def test_exif_orientation_is_applied(tmp_path):
    pixels = np.full((20, 40, 3), 128, np.uint8)
    pixels[:6, :6] = (255, 0, 0)  # red in the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6  # display = stored rotated 90 degrees clockwise
    path = save(Image.fromarray(pixels), tmp_path / "phone.jpg", exif=exif, quality=95)
    info = here.probe(path)
    assert (info.kind, info.width, info.height, info.duration) == ("image", 20, 40, None)
    image = here.load_image(path)
    assert image.size == (20, 40)
    assert_colour(image.getpixel((image.width - 3, 2)), (255, 0, 0))  # now top-right


def test_exif_orientation_keeps_the_mode_and_transparency(tmp_path):
    pixels = np.zeros((20, 40, 2), np.uint8)
    pixels[:6, :6] = (200, 255)  # an opaque grey corner in the stored top-left; the rest transparent
    exif = Image.Exif()
    exif[0x0112] = 6
    path = save(Image.fromarray(pixels, "LA"), tmp_path / "la.png", exif=exif)
    image = here.load_image(path)
    assert (image.mode, image.size) == ("LA", (20, 40))
    assert image.getpixel((image.width - 3, 2)) == (200, 255) and image.getpixel((2, 2)) == (0, 0)


def test_an_image_samples_as_one_frame_at_zero(tmp_path):
    path = save(Image.new("RGB", (30, 20), (9, 8, 7)), tmp_path / "still.png")
    frames = list(here.sample_frames(path, 2))
    assert [(f.time, f.image.size) for f in frames] == [(0.0, (30, 20))]
    assert list(here.sample_frames(path, 2, start=5.0)) == []


def test_sample_media_cli_writes_every_sample(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_sample_media.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    listed = {Path(line.split("\t")[1]) for line in done.stdout.splitlines()}
    assert listed == set(tmp_path.iterdir())
    kinds = {}
    for path in sorted(tmp_path.iterdir()):
        try:
            kinds[path.stem] = here.probe(path).kind
        except MediaError:
            kinds[path.stem] = "error"
    assert kinds == {
        "10bit": "video",  # .mp4 (h264 High 10) or .mkv (FFV1) depending on the build
        "audio_only": "error",
        "cfr_25fps": "video",
        "odd_641x359": "video",
        "rotated_90": "video",
        "truncated": "error",
        "truncated_faststart": "video",
        "vfr": "video",
        "zero_frames": "video",
    }


# ---------------------------------------------------------------------------- hostile headers
# (more in test_fuzz_media.py: seeded mutations of every sample kind and the kept findings)


def test_a_stream_without_a_decoder_is_a_media_error(tmp_path):
    clip = make_clip(tmp_path / "clip.mp4", 0.5, 10)
    unknown = _write(tmp_path / "unknown.mp4", clip.read_bytes().replace(b"avc1", b"zzzz"))
    with av.open(str(unknown)) as container:
        assert container.streams.video[0].codec_context is None
    message = f"{unknown}: no decoder for its video codec (unknown or damaged codec id)"
    with pytest.raises(MediaError) as probed:
        here.probe(unknown)
    assert str(probed.value) == message
    with pytest.raises(MediaError, match="no decoder"):
        list(here.sample_frames(unknown, 1))


def test_a_png_header_cut_short_is_a_media_error(tmp_path):
    whole = bytearray(png_header(24, 16))
    whole[8:12] = struct.pack(">I", 4)  # IHDR claims 4 bytes: Pillow raises ValueError in open()
    path = _write(tmp_path / "short_ihdr.png", bytes(whole))
    for read in (here.probe, here.load_image, lambda p: list(here.sample_frames(p, 1))):
        with pytest.raises(MediaError) as raised:
            read(path)
        assert str(raised.value) == f"{path}: corrupt image: Truncated IHDR chunk"


def _constant_sample_size(data: bytes, size: int, count: int) -> bytes:
    """`data` (an mp4) with its stsz box saying: `count` samples, all of `size` bytes."""
    at = data.index(b"stsz") + 4  # version and flags, then the size and the count
    return data[: at + 4] + struct.pack(">II", size, count) + data[at + 12 :]


def test_sample_counts_the_file_cannot_hold_are_refused_before_ffmpeg_reads_them(tmp_path):
    data = make_clip(tmp_path / "clip.mp4", 0.5, 10).read_bytes()
    # FFmpeg builds an index entry for every claimed sample: 2**26 of them grew a decoder to 3.6 GB.
    claimed = _write(tmp_path / "claimed.mp4", _constant_sample_size(data, 1, 1 << 26))
    message = f"{claimed}: damaged sample table: 67108864 samples of 1 byte(s) claimed in a file of {len(data)} bytes"
    for read in (here.probe, lambda p: list(here.sample_frames(p, 1))):
        with pytest.raises(MediaError) as raised:
            read(claimed)
        assert str(raised.value) == message
    # A count the file can hold is left to FFmpeg (here: samples that are not where it says).
    plausible = _write(tmp_path / "plausible.mp4", _constant_sample_size(data, 1, 5))
    with pytest.raises(MediaError, match="could be decoded"):
        here.probe(plausible)


def test_constant_sample_sizes_in_real_files_pass_the_claim_check(tmp_path):
    # Uncompressed video in MOV stores one sample size for all frames, as a damaged stsz does.
    clip = make_clip(tmp_path / "raw.mov", 0.5, 10, codec="rawvideo", pix_fmt="rgb24")
    data = clip.read_bytes()
    at = data.index(b"stsz") + 8
    assert struct.unpack(">II", data[at : at + 8]) == (64 * 48 * 3, 5)
    assert [read_frame_index(f.image) for f in here.sample_frames(clip, 10)] == [0, 1, 2, 3, 4]
