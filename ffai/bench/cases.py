"""The bench's inputs: four cases, the decoding budget both arms share, the quality items.

Images are synthetic (seeded gradients plus noise, so resizing keeps structure) and built the
same way in each arm's process; the clip is written once per run by the parent and both arms
decode that one file with ``ffai.media.Decoder.sample_frames``. The default checkpoint (the engine's
random one; SmolVLM's has the real SmolVLM-256M shapes) is ``ffai.bench.checkpoints.default_checkpoint``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ffai.engines.contract import DecodingOptions, Request
from ffai.errors import FfaiError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

CASES = ("frame", "still", "window", "clip")
N_NEW = 32  # forced new tokens per item, so both arms do the same work
FRAME_SIZE = (640, 360)
STILL_SIZE = (2048, 1536)
WINDOW_FRAMES = 8
CLIP_SECONDS, CLIP_SOURCE_FPS = 12.0, 25
CLIP_FPS, CLIP_WINDOW = 1.0, 2  # `ffai caption --fps 1 --window 2`: 6 windows of 2 frames
CLIP_CODEC_OPTIONS = {"preset": "veryfast"}


@dataclass(frozen=True)
class Item:
    """One request both arms answer: a still (``times`` None) or frames at their times."""

    id: str
    images: tuple  # PIL images, RGB
    times: tuple[float, ...] | None
    span: tuple[float, float] | None = None  # a window's (start, end); None: first to last frame

    @property
    def still(self) -> bool:
        return self.times is None

    def request(self, options: DecodingOptions) -> Request:
        if self.times is None:
            return Request(self.images, options)
        # The window's own span, as `ffai caption` sends it: a video model states its duration.
        return Request.frames(self.images, self.times, options, span=self.span)


def frame_times(n: int, fps: float = CLIP_FPS) -> tuple[float, ...]:
    """Times of ``n`` frames sampled at ``fps`` from 0: for synthetic windows."""
    return tuple(i / fps for i in range(n))


def decoding(max_new_tokens: int = N_NEW) -> DecodingOptions:
    """Greedy, exactly ``max_new_tokens`` new tokens (stop tokens masked, as min_new_tokens does)."""
    return DecodingOptions(max_new_tokens=max_new_tokens, force_new_tokens=True)


def synthetic_image(seed: int, size: tuple[int, int]) -> "Image.Image":
    """A (width, height) RGB image: smooth colour waves plus noise, the same for the same seed."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    w, h = size
    freqs = [(rng.uniform(2, 9), rng.uniform(2, 9)) for _ in range(3)]  # (x, y) per channel, drawn in that order
    out = np.empty((h, w, 3), np.uint8)
    # By blocks of rows, the noise drawn in the same order as one (h, w, 3) draw: the same bytes as
    # whole-image float64 arithmetic, without its large temporaries for a still, which the arms'
    # peak RSS would otherwise count as theirs (docs/benchmarks-log.md, *The bench's own images*).
    for top in range(0, h, 64):
        yy, xx = np.mgrid[top : min(top + 64, h), 0:w] / max(w, h)
        waves = [np.sin(xx * fx + c) * np.cos(yy * fy) for c, (fx, fy) in enumerate(freqs)]
        pixels = np.stack(waves, -1) * 80 + 128 + rng.normal(0, 25, (*yy.shape, 3))
        out[top : top + yy.shape[0]] = pixels.clip(0, 255).astype(np.uint8)
    return Image.fromarray(out)


def items(case: str, clip: Path | None = None) -> list[Item]:
    """The requests of ``case``; ``clip`` cases need the clip file (decoded here, windowed)."""
    if case == "frame":
        return [Item("frame", (synthetic_image(1, FRAME_SIZE),), frame_times(1))]
    if case == "still":
        return [Item("still", (synthetic_image(2, STILL_SIZE),), None)]
    if case == "window":
        frames = tuple(synthetic_image(10 + i, FRAME_SIZE) for i in range(WINDOW_FRAMES))
        return [Item("window", frames, frame_times(WINDOW_FRAMES))]
    if case == "clip":
        if clip is None:
            raise UsageError("the clip case needs its clip file")
        return list(clip_items(clip))
    raise UsageError(f"unknown bench case {case!r} (known: {', '.join(CASES)})")


def clip_items(clip: Path) -> Iterator[Item]:
    """The clip's windows as `ffai caption --fps 1 --window 2` forms them, one Item each."""
    from ffai import media
    from ffai.run.windows import make_windows

    decoder = media.Decoder(isolated=False)  # in this process: the arm measures the engine alone
    info = decoder.probe(clip)
    frames = decoder.sample_frames(clip, CLIP_FPS)
    for window in make_windows(frames, CLIP_WINDOW, CLIP_FPS, clip_end=info.duration):
        frames = tuple(f.image for f in window.frames)
        yield Item(str(window.index), frames, window.frame_times, (window.start, window.end))


def write_clip(path: Path) -> Path:
    """A 12 s, 25 fps, 640x360 clip whose content drifts frame to frame (h264, else mpeg4)."""
    import av
    import numpy as np

    from ffai import media

    base = np.asarray(synthetic_image(3, (FRAME_SIZE[0] * 2, FRAME_SIZE[1])))  # (h, 2w, 3)
    codec = media.video_encoder()
    with av.open(str(path), "w") as container:
        options = CLIP_CODEC_OPTIONS if codec == "libx264" else {}
        stream = container.add_stream(codec, rate=CLIP_SOURCE_FPS, options=options)
        stream.width, stream.height, stream.pix_fmt = *FRAME_SIZE, "yuv420p"
        for i in range(round(CLIP_SECONDS * CLIP_SOURCE_FPS)):
            # Pan across a double-width picture so every sampled frame differs.
            shift = i * FRAME_SIZE[0] // (CLIP_SECONDS * CLIP_SOURCE_FPS)
            pixels = np.ascontiguousarray(base[:, int(shift) : int(shift) + FRAME_SIZE[0]])
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, CLIP_SOURCE_FPS)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


# --- the quality corpus ------------------------------------------------------------------------

DEMO_MODEL = "smolvlm-demo"
DEMO_N, DEMO_SEED = 200, 1
CORPUS_QUESTIONS = "questions.jsonl"
CORPUS_MAX_NEW = 32


@dataclass(frozen=True)
class QualityItem:
    """A question with one right answer, scored by exact match (surrounding spaces aside)."""

    id: str
    images: tuple
    times: tuple[float, ...] | None  # None: a still
    prompt: str | None  # None: the engine's default caption request
    answer: str
    max_new_tokens: int

    @property
    def still(self) -> bool:
        return self.times is None

    def request(self, options: DecodingOptions) -> Request:
        return Request.of(self.images, self.times, options)


def is_demo_model(model_dir: Path) -> bool:
    """True when ``model_dir`` is the folder the name ``smolvlm-demo`` resolves to."""
    from ffai import models

    try:
        demo = models.resolve(DEMO_MODEL)
    except FfaiError:  # not installed here (or no manifest yet)
        return False
    return Path(model_dir).resolve() == demo.resolve()


def demo_items(n: int = DEMO_N, seed: int = DEMO_SEED) -> list[QualityItem]:
    """The demo model's held-out scenes (``demo_eval.items``), rendered here."""
    from ffai.bench import demo_eval

    return [
        QualityItem(str(i), tuple(item.images()), item.times, None, item.answer, demo_eval.MAX_NEW_TOKENS)
        for i, item in enumerate(demo_eval.items(n, seed))
    ]


def corpus_items(folder: Path) -> list[QualityItem]:
    """``folder/questions.jsonl`` lines {"image", "question", "answer"}, images relative to folder."""
    from ffai import media

    questions = Path(folder) / CORPUS_QUESTIONS
    if not questions.is_file():
        raise UsageError(f"--quality-corpus {folder}: no {CORPUS_QUESTIONS} in this folder")
    out = []
    for n, line in enumerate(questions.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            image, question, answer = row["image"], row["question"], row["answer"]
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f'{questions}:{n}: expected {{"image", "question", "answer"}} ({e})') from e
        still = media.Decoder(isolated=False).load_image(Path(folder) / image)
        out.append(QualityItem(str(n), (still,), None, question, str(answer), CORPUS_MAX_NEW))
    if not out:
        raise UsageError(f"{questions}: no questions")
    return out
