"""An independent reading of a clip's timestamps and the sampling rule applied to them, for
tests that check ffai.media against them. The clips themselves come from scripts/sample_media.py:

    from sample_media import make_clip
    clip = make_clip(tmp_path / "clip.mp4", seconds=12, fps=25)  # 64x48, about 0.2 s to write
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av


def decoded_times(path: str | Path) -> list[float]:
    """Every frame's presentation time in seconds from the stream's start_time, decoded here
    with PyAV directly (the reference the sampler is checked against)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        origin = stream.start_time or 0
        return [float((frame.pts - origin) * stream.time_base) for frame in container.decode(stream)]


def expected_sample_times(
    times: Sequence[float],
    fps: float,
    start: float = 0.0,
    duration: float | None = None,
    max_frames: int | None = None,
    eps: float = 1e-6,
) -> list[float]:
    """The sampling rule spelled out literally: for each deadline start + n / fps, the first
    frame at or after it (within [start, start + duration)); a frame picked for several
    deadlines counts once."""
    end = math.inf if duration is None else start + duration
    candidates = sorted(t for t in times if start - eps <= t < end - eps)
    picks: list[float] = []
    n = 0
    while max_frames is None or len(picks) < max_frames:
        deadline = start + n / fps
        pick = next((t for t in candidates if t >= deadline - eps), None)
        if pick is None:
            break
        if not picks or pick != picks[-1]:
            picks.append(pick)
        n += 1
    return picks


def make_av_clip(
    path: str | Path,
    seconds: float,
    video: str,
    audio: str | None,
    *,
    fps: int = 10,
    size: tuple[int, int] = (64, 48),
    pix_fmt: str = "yuv420p",
    rotation: int = 0,
    subtitles: Sequence[tuple[int, int, str]] = (),
    options: dict[str, str] | None = None,
) -> Path:
    """A clip with a video stream (``video`` encoder, frame i drawing index i), an optional audio
    stream (a 440 Hz tone, ``audio`` encoder) and optional subrip cues ``(start_ms, end_ms,
    text)``, for the container tests: the streams ffai copies, made here, never downloaded."""
    import numpy as np

    from sample_media import draw_frame

    path = Path(path)
    with av.open(str(path), "w") as container:
        v = container.add_stream(video, rate=fps, options={"preset": "veryfast"} if video == "libx264" else {})
        if video == "libx265":
            v.options = {"preset": "ultrafast", "x265-params": "log-level=error"}
        v.options.update(options or {})
        v.width, v.height, v.pix_fmt = *size, pix_fmt
        v.codec_context.gop_size = fps  # a keyframe every second, for -ss to land on
        if rotation:
            v.set_display_rotation(rotation)
        a = None
        if audio is not None:
            rate = 48000 if audio == "libopus" else 16000
            a = container.add_stream(audio, rate=rate, layout="mono")
            a.metadata["language"] = "fra"
        s = None
        if subtitles:
            s = container.add_stream("subrip")
            s.codec_context.subtitle_header = b"[Script Info]\nScriptType: v4.00+\n\n[Events]\nFormat: Layer, Start, End, Style, Name, MarginL, MarginR, MarginV, Effect, Text\n"
            s.metadata["language"] = "eng"
        container.start_encoding()
        for i in range(round(seconds * fps)):
            frame = av.VideoFrame.from_ndarray(draw_frame(i, *size), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(v.encode(frame))
        container.mux(v.encode(None))
        if a is not None:
            block = 960 if audio == "libopus" else 1024
            t = np.arange(round(seconds * a.rate), dtype=np.float32) / a.rate
            tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
            fmt = "flt" if audio == "libopus" else "fltp"
            for start in range(0, len(tone) - block + 1, block):
                samples = tone[None, start : start + block]
                frame = av.AudioFrame.from_ndarray(samples, format=fmt, layout="mono")
                frame.sample_rate, frame.pts = a.rate, start
                container.mux(a.encode(frame))
            container.mux(a.encode(None))
        for start_ms, end_ms, text in subtitles:
            cue = av.subtitles.subtitle.SubtitleSet.create(
                f"0,0,Default,,0,0,0,,{text}".encode(), 0, end_ms - start_ms, pts=start_ms
            )
            packet = s.codec_context.encode_subtitle(cue)
            packet.time_base, packet.stream = Fraction(1, 1000), s
            container.mux(packet)
    return path


def reencode_vp9(source: str | Path, path: str | Path, width: int) -> Path:
    """``source``'s frames, scaled to ``width`` (height in proportion), as VP9 in WebM at the same
    times: a WebM the browser plays, made from a clip that is not one (the bundled demo clip)."""
    path = Path(path)
    with av.open(str(source)) as src, av.open(str(path), "w") as dst:
        video = src.streams.video[0]
        height = round(video.height * width / video.width / 2) * 2
        out = dst.add_stream("libvpx-vp9", rate=video.average_rate, options={"deadline": "realtime", "cpu-used": "8"})
        out.width, out.height, out.pix_fmt = width, height, "yuv420p"
        out.codec_context.time_base = video.time_base
        for frame in src.decode(video):
            scaled = frame.reformat(width=width, height=height, format="yuv420p")
            scaled.pts, scaled.time_base = frame.pts, video.time_base
            dst.mux(out.encode(scaled))
        dst.mux(out.encode(None))
    return path


def count_decoded(monkeypatch) -> list[int]:
    """Counts every frame ``ffai.media.video.decode`` gives out from now on (one cell, incremented)."""
    from ffai.media import video

    counter = [0]
    decode = video.decode

    def counting(*args, **kwargs):
        for item in decode(*args, **kwargs):
            counter[0] += 1
            yield item

    monkeypatch.setattr(video, "decode", counting)
    return counter
