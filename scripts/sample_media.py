"""Small test clips written with PyAV, for the tests, the media checks and the sample-media script.

Every frame carries its own index, drawn as 16 black/white cells, so a test can tell which
source frame it got back (`read_frame_index`). Three corners carry fixed colours (red top-left,
green top-right, blue bottom-left) so a test can check orientation after rotation.

Each `make_*` function writes one file and returns its path; `make_all` writes every sample
into one folder (``python scripts/make_sample_media.py OUTDIR``).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

from ffai.media import video_encoder

GRID = (8, 6)  # the frame is cut into 8 columns x 6 rows of cells
INDEX_BITS = 16  # rows 2 and 3 of the grid: bit k (LSB first) in column k % 8, row 2 + k // 8
CORNERS = {"top_left": (255, 0, 0), "top_right": (0, 255, 0), "bottom_left": (0, 0, 255)}

# Irregular gaps (milliseconds) for the variable-frame-rate clip: bursts, long holds, and gaps
# both shorter and longer than the usual sampling periods.
VFR_GAPS_MS = (40, 10, 80, 200, 10, 5, 300, 40, 40, 33, 67, 500, 20, 20, 20, 250, 15, 135, 400, 60)


def _cell(width: int, height: int, col: int, row: int) -> tuple[slice, slice]:
    cw, ch = width // GRID[0], height // GRID[1]
    return slice(row * ch, (row + 1) * ch), slice(col * cw, (col + 1) * cw)


def draw_frame(index: int, width: int, height: int) -> np.ndarray:
    """An RGB frame (height, width, 3) uint8 that encodes `index` and the corner markers."""
    if width < GRID[0] * 2 or height < GRID[1] * 2:
        raise ValueError(f"frame {width}x{height} too small for the {GRID[0]}x{GRID[1]} grid")
    # A grey that ramps with time, so consecutive frames also differ in overall colour.
    shade = 64 + (index * 7) % 128
    frame = np.full((height, width, 3), shade, np.uint8)
    cols, rows = GRID
    frame[_cell(width, height, 0, 0)] = CORNERS["top_left"]
    frame[_cell(width, height, cols - 1, 0)] = CORNERS["top_right"]
    frame[_cell(width, height, 0, rows - 1)] = CORNERS["bottom_left"]
    for bit in range(INDEX_BITS):
        on = (index >> bit) & 1
        frame[_cell(width, height, bit % cols, 2 + bit // cols)] = 255 if on else 0
    return frame


def read_frame_index(image: Image.Image) -> int:
    """The index drawn by `draw_frame`, read back from an upright (unrotated) RGB image."""
    pixels = np.asarray(image.convert("L"), dtype=np.float32)
    height, width = pixels.shape
    index = 0
    for bit in range(INDEX_BITS):
        rows, cols = _cell(width, height, bit % GRID[0], 2 + bit // GRID[0])
        # The cell's centre half avoids edges blurred by chroma subsampling and compression.
        r0, r1 = rows.start + (rows.stop - rows.start) // 4, rows.stop - (rows.stop - rows.start) // 4
        c0, c1 = cols.start + (cols.stop - cols.start) // 4, cols.stop - (cols.stop - cols.start) // 4
        if pixels[r0:r1, c0:c1].mean() > 128:
            index |= 1 << bit
    return index


def _encode(
    path: Path,
    times: Sequence[int],
    time_base: Fraction,
    size: tuple[int, int],
    codec: str,
    pix_fmt: str,
    rate: Fraction,
    rotation: int = 0,
    options: dict[str, str] | None = None,
    container_options: dict[str, str] | None = None,
) -> Path:
    """Encode one frame per entry of `times` (pts in `time_base`), frame i drawing index i."""
    width, height = size
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", options=container_options or {}) as container:
        stream = container.add_stream(codec, rate=rate, options=_codec_options(codec, options))
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.codec_context.time_base = time_base
        # A keyframe every second, so seeking has somewhere to land besides frame 0.
        stream.codec_context.gop_size = max(1, round(float(rate)))
        if rotation:
            stream.set_display_rotation(rotation)
        for i, pts in enumerate(times):
            frame = av.VideoFrame.from_ndarray(draw_frame(i, width, height), format="rgb24")
            frame.pts, frame.time_base = pts, time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def _codec_options(codec: str, options: dict[str, str] | None) -> dict[str, str]:
    # veryfast keeps B-frames (so decode order differs from presentation order) yet stays quick.
    defaults = {"preset": "veryfast"} if codec == "libx264" else {}
    return {**defaults, **(options or {})}


def _as_rate(fps: float) -> Fraction:
    return Fraction(fps).limit_denominator(1001)


def make_clip(
    path: str | Path,
    seconds: float,
    fps: float = 25,
    size: tuple[int, int] = (64, 48),
    *,
    codec: str | None = None,
    pix_fmt: str = "yuv420p",
    rotation: int = 0,
    options: dict[str, str] | None = None,
) -> Path:
    """A constant-frame-rate clip of round(seconds * fps) frames; frame i has pts i / fps."""
    rate = _as_rate(fps)
    count = round(seconds * float(rate))
    return _encode(Path(path), range(count), 1 / rate, size, codec or video_encoder(), pix_fmt, rate, rotation, options)


def vfr_times_ms(gaps_ms: Sequence[int] = VFR_GAPS_MS) -> list[int]:
    """Presentation times (ms) of the VFR clip: 0, then the running sum of the gaps."""
    times = [0]
    for gap in gaps_ms:
        times.append(times[-1] + gap)
    return times


def make_vfr_clip(
    path: str | Path, gaps_ms: Sequence[int] = VFR_GAPS_MS, size: tuple[int, int] = (64, 48), b_frames: int = 0
) -> Path:
    """A variable-frame-rate clip: pts set by hand (millisecond time base) with irregular gaps.

    No B-frames by default: with them libx264 invents decode timestamps for the irregular gaps
    and mp4 then records a duration shorter than the last frame's time (Matroska does not).
    """
    times, codec = vfr_times_ms(gaps_ms), video_encoder()
    options = {"bf": str(b_frames)}
    return _encode(Path(path), times, Fraction(1, 1000), size, codec, "yuv420p", Fraction(25), options=options)


def make_odd_size_clip(path: str | Path, seconds: float = 1.0, size: tuple[int, int] = (641, 359)) -> Path:
    """Odd width and height: 4:2:0 h264 refuses odd sizes, so h264 uses 4:4:4 (mpeg4 pads 4:2:0)."""
    codec = video_encoder()
    pix_fmt = "yuv444p" if codec == "libx264" else "yuv420p"
    return make_clip(path, seconds, 10, size, codec=codec, pix_fmt=pix_fmt)


def make_rotated_clip(path: str | Path, rotation: int = 90, seconds: float = 1.0) -> Path:
    """Display-matrix side data on the stream: rotate counter-clockwise by `rotation` to show it."""
    return make_clip(path, seconds, 10, rotation=rotation)


def make_10bit_clip(path: str | Path, seconds: float = 1.0) -> Path:
    """yuv420p10le: h264 High 10 when libx264 supports it, else lossless FFV1 (write a .mkv)."""
    path = Path(path)
    if video_encoder() == "libx264":
        try:
            return make_clip(path, seconds, 10, codec="libx264", pix_fmt="yuv420p10le")
        except av.FFmpegError:  # an 8-bit-only libx264 build
            path.unlink(missing_ok=True)
    return make_clip(path.with_suffix(".mkv"), seconds, 10, codec="ffv1", pix_fmt="yuv420p10le")


def make_zero_frame_clip(path: str | Path, size: tuple[int, int] = (64, 48)) -> Path:
    """A Matroska file whose video stream has no packets; an audio track carries the timeline.

    mp4 drops a track without samples and Matroska refuses a file without any packet, so the
    audio track is what keeps the empty video stream in the file.
    """
    path = Path(path)
    with av.open(str(path), "w") as container:
        video = container.add_stream("mpeg4", rate=25)
        video.width, video.height, video.pix_fmt = *size, "yuv420p"
        audio = container.add_stream("aac", rate=16000, layout="mono")
        container.start_encoding()
        _write_silence(container, audio, blocks=10)
    return path


def make_audio_only(path: str | Path, seconds: float = 1.0) -> Path:
    """An AAC track in an mp4 container, no video stream."""
    path = Path(path)
    with av.open(str(path), "w") as container:
        audio = container.add_stream("aac", rate=16000, layout="mono")
        _write_silence(container, audio, blocks=max(1, round(seconds * 16000 / 1024)))
    return path


def _write_silence(container, audio, blocks: int) -> None:
    for i in range(blocks):
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, i * 1024
        container.mux(audio.encode(frame))
    container.mux(audio.encode(None))


def truncate(source: str | Path, path: str | Path, fraction: float = 0.5) -> Path:
    """Copy the first `fraction` of `source`'s bytes to `path`."""
    data = Path(source).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * fraction)])
    return Path(path)


def make_truncated_mp4(path: str | Path, seconds: float = 8.0, *, faststart: bool = False) -> Path:
    """An mp4 cut in half. Without faststart the index (moov, written last) is lost and the file
    cannot be opened; with faststart it opens and decoding fails part-way through."""
    path = Path(path)
    whole = path.with_name(path.stem + ".whole.mp4")
    options = {"movflags": "+faststart"} if faststart else None
    rate = Fraction(25)
    _encode(
        whole,
        range(round(seconds * 25)),
        1 / rate,
        (64, 48),
        video_encoder(),
        "yuv420p",
        rate,
        container_options=options,
    )
    truncate(whole, path)
    whole.unlink()
    return path


def make_all(outdir: str | Path) -> dict[str, Path]:
    """Every sample, by name, written into `outdir`."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "cfr": make_clip(out / "cfr_25fps.mp4", 4.0),
        "vfr": make_vfr_clip(out / "vfr.mp4"),
        "odd_size": make_odd_size_clip(out / "odd_641x359.mp4"),
        "rotated": make_rotated_clip(out / "rotated_90.mp4"),
        "10bit": make_10bit_clip(out / "10bit.mp4"),
        "zero_frames": make_zero_frame_clip(out / "zero_frames.mkv"),
        "audio_only": make_audio_only(out / "audio_only.mp4"),
        "truncated": make_truncated_mp4(out / "truncated.mp4"),
        "truncated_faststart": make_truncated_mp4(out / "truncated_faststart.mp4", faststart=True),
    }
