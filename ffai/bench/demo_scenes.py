"""Synthetic scenes for the bundled demo model: one coloured shape on a plain background.

A scene is a shape (circle, square, triangle, star, cross) in one colour on a plain background
of another colour name, at some position and size, either still or moving in a straight line
across the frames it is rendered to. Scenes come in two polarities: a bright shape on a dark
background (``light-on-dark``) or a deep-coloured shape on a light background
(``dark-on-light``); each polarity has its own palette, so every (shape colour, background)
pair it allows is far apart in brightness as well as in name. Its caption names only what a
viewer can check at a glance: ``caption(scene) == "a red circle on a blue background"``.

Training, evaluation and the tests draw scenes from here, so they share one label space and one
rendering. The held-out split is by *geometry*: every scene falls into a cell (size bucket,
start position bucket, motion direction) and a fixed hash sends one cell in eight to
``heldout``; ``train`` never draws from those cells. Held-out scenes therefore show label
combinations the model has seen at sizes, places and motions it has not.

Canvases of any aspect ratio are drawn as they are; the engine squashes each frame to its
square tile (as the Idefics3 processor does, no padding), so on a 641x359 frame a circle
reaches the model as an upright ellipse 1.8 times as tall as wide. ``random_canvas`` draws such
frames for training.

Rewrite the bundled clip: ``python scripts/demo_scenes.py --clip examples/demo_clip.mp4``.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

SHAPES = ("circle", "square", "triangle", "star", "cross")
LIGHT_ON_DARK, DARK_ON_LIGHT = "light-on-dark", "dark-on-light"
POLARITIES = (LIGHT_ON_DARK, DARK_ON_LIGHT)
# Per polarity, the shape colours and the backgrounds it may be drawn on (any shape colour on any
# background of another name). A colour name has one shade per polarity: "green" is a bright
# green on dark backgrounds and a deep green on light ones, so the shape is always clearly the
# lighter (or darker) side of every edge; "gray" is a dark gray behind bright shapes and a light
# gray behind deep ones. The light-on-dark palette is the one the first demo model was trained on.
SHAPE_COLOURS: dict[str, dict[str, tuple[int, int, int]]] = {
    LIGHT_ON_DARK: {
        "red": (235, 50, 50),
        "green": (70, 210, 80),
        "blue": (80, 140, 255),
        "yellow": (250, 225, 60),
        "white": (250, 250, 250),
        "pink": (255, 140, 210),
    },
    DARK_ON_LIGHT: {
        "red": (200, 30, 30),
        "green": (25, 130, 45),
        "blue": (30, 60, 200),
        "black": (20, 20, 20),
        "purple": (110, 40, 160),
    },
}
BACKGROUND_COLOURS: dict[str, dict[str, tuple[int, int, int]]] = {
    LIGHT_ON_DARK: {
        "black": (10, 10, 10),
        "gray": (75, 75, 75),
        "blue": (20, 35, 120),
        "green": (20, 85, 35),
        "purple": (70, 25, 90),
    },
    DARK_ON_LIGHT: {
        "white": (248, 248, 248),
        "yellow": (250, 230, 100),
        "pink": (255, 195, 220),
        "gray": (195, 195, 195),
    },
}
# Every colour and background name, in a fixed order (the training's label head indexes them).
COLOURS = tuple(dict.fromkeys(c for p in POLARITIES for c in SHAPE_COLOURS[p]))
BACKGROUNDS = tuple(dict.fromkeys(b for p in POLARITIES for b in BACKGROUND_COLOURS[p]))
SPLITS = ("train", "heldout")

# Geometry ranges, as fractions of the frame. The radius is of the frame's short side; centres
# stay inside [EDGE, 1 - EDGE] so the shape is always mostly visible.
RADIUS = (0.2, 0.34)
EDGE = 0.28
TRAVEL = (0.1, 0.4)  # how far a moving shape goes over the whole render, fraction of the frame
SIZE_BINS = 4
POSITION_BINS = 3
DIRECTIONS = 8  # compass directions of motion; cell 0 is "still"
MOVING_SHARE = 0.7
HELDOUT_ONE_IN = 8
# Canvases drawn by random_canvas: width / height log-uniform over ASPECT (portrait 9:16 is
# 0.56, wide 16:9 is 1.78), the long side uniform over LONG_SIDE pixels.
ASPECT = (0.42, 2.4)
LONG_SIDE = (64, 400)

# The bundled clip (examples/demo_clip.mp4): four scenes, two moving, two still.
CLIP_SIZE = (128, 96)
CLIP_FPS = 10
CLIP_SECONDS_PER_SCENE = 3.0


@dataclass(frozen=True)
class Scene:
    shape: str
    colour: str
    background: str
    radius: float  # fraction of the frame's short side
    start: tuple[float, float]  # shape centre on the first frame, fractions of (width, height)
    end: tuple[float, float]  # centre on the last frame; equal to start for a still scene
    polarity: str = LIGHT_ON_DARK

    def __post_init__(self) -> None:
        if self.polarity not in POLARITIES:
            raise ValueError(f"polarity must be one of {POLARITIES}, got {self.polarity!r}")
        if (
            self.shape not in SHAPES
            or self.colour not in SHAPE_COLOURS[self.polarity]
            or self.background not in BACKGROUND_COLOURS[self.polarity]
        ):
            raise ValueError(f"unknown label in {self}")
        if self.colour == self.background:
            raise ValueError(f"a {self.colour} shape on a {self.background} background would be invisible")

    @property
    def moving(self) -> bool:
        return self.start != self.end

    def centre(self, t: float) -> tuple[float, float]:
        """Centre at time ``t`` in [0, 1] of the render."""
        (x0, y0), (x1, y1) = self.start, self.end
        return x0 + t * (x1 - x0), y0 + t * (y1 - y0)


CLIP_SCENES = (
    Scene("circle", "red", "blue", 0.26, (0.3, 0.5), (0.7, 0.5)),
    Scene("star", "yellow", "black", 0.3, (0.5, 0.5), (0.5, 0.5)),
    Scene("triangle", "white", "green", 0.26, (0.65, 0.35), (0.35, 0.65)),
    Scene("square", "pink", "gray", 0.24, (0.45, 0.55), (0.45, 0.55)),
)


def caption(scene: Scene) -> str:
    return f"a {scene.colour} {scene.shape} on a {scene.background} background"


def all_captions() -> list[str]:
    """Every caption the label space allows, once each (the tokenizer's training corpus uses
    them); "a red circle on a gray background" is a caption of both polarities."""
    return list(
        dict.fromkeys(
            caption(Scene(shape, colour, bg, RADIUS[0], (0.5, 0.5), (0.5, 0.5), polarity))
            for polarity in POLARITIES
            for shape in SHAPES
            for colour in SHAPE_COLOURS[polarity]
            for bg in BACKGROUND_COLOURS[polarity]
            if colour != bg
        )
    )


# --- the geometry split ------------------------------------------------------------------------


def _bin(value: float, lo: float, hi: float, n: int) -> int:
    return min(int((value - lo) / (hi - lo) * n), n - 1)


def geometry_cell(scene: Scene) -> tuple[int, int, int, int]:
    """(size bucket, start x bucket, start y bucket, motion: 0 still or 1 + compass direction)."""
    (x0, y0), (x1, y1) = scene.start, scene.end
    motion = 0
    if scene.moving:
        angle = math.atan2(y1 - y0, x1 - x0) % (2 * math.pi)
        motion = 1 + round(angle / (2 * math.pi / DIRECTIONS)) % DIRECTIONS
    return (
        _bin(scene.radius, *RADIUS, SIZE_BINS),
        _bin(x0, EDGE, 1 - EDGE, POSITION_BINS),
        _bin(y0, EDGE, 1 - EDGE, POSITION_BINS),
        motion,
    )


def split_of(scene: Scene) -> str:
    """``heldout`` for one geometry cell in HELDOUT_ONE_IN (a fixed hash, no seed), else ``train``."""
    key = ",".join(map(str, geometry_cell(scene))).encode()
    return "heldout" if int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % HELDOUT_ONE_IN == 0 else "train"


def _draw_scene(rng: random.Random) -> Scene:
    polarity = rng.choice(POLARITIES)
    shape = rng.choice(SHAPES)
    colour = rng.choice(list(SHAPE_COLOURS[polarity]))
    background = rng.choice([b for b in BACKGROUND_COLOURS[polarity] if b != colour])
    radius = rng.uniform(*RADIUS)
    start = (rng.uniform(EDGE, 1 - EDGE), rng.uniform(EDGE, 1 - EDGE))
    end = start
    if rng.random() < MOVING_SHARE:
        angle = rng.randrange(DIRECTIONS) * 2 * math.pi / DIRECTIONS
        travel = rng.uniform(*TRAVEL)
        # Clamping keeps the shape in frame; a shape pinned in a corner may end up still.
        end = tuple(_clamp(c + travel * d) for c, d in zip(start, (math.cos(angle), math.sin(angle))))
    return Scene(shape, colour, background, radius, start, end, polarity)


def _clamp(value: float) -> float:
    return min(max(value, EDGE), 1 - EDGE)


def sample_scene(rng: random.Random, split: str) -> Scene:
    """One scene of ``split``, drawn from ``rng`` (rejection over the geometry cells)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    while True:
        scene = _draw_scene(rng)
        if split_of(scene) == split:
            return scene


def scenes(split: str, n: int, seed: int) -> list[Scene]:
    """``n`` scenes of ``split``, the same for the same seed."""
    rng = random.Random(f"{split}/{seed}")
    return [sample_scene(rng, split) for _ in range(n)]


def random_canvas(rng: random.Random) -> tuple[int, int]:
    """A (width, height) of any aspect ratio within ASPECT, the long side within LONG_SIDE."""
    aspect = math.exp(rng.uniform(math.log(ASPECT[0]), math.log(ASPECT[1])))
    long_side = rng.randint(*LONG_SIDE)
    if aspect >= 1:
        return long_side, max(1, round(long_side / aspect))
    return max(1, round(long_side * aspect)), long_side


def aspect_ratio(canvas: tuple[int, int]) -> float:
    """The long side over the short side: 1.0 for a square, 1.79 for 641x359 or 359x641."""
    width, height = canvas
    return max(width, height) / min(width, height)


# --- rendering ---------------------------------------------------------------------------------


def _outline(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """Polygon vertices of a non-circle shape of radius ``r`` around (cx, cy), in pixels."""
    if shape == "square":
        h = r * 0.85  # a square of the same radius would look much bigger than the circle
        return [(cx - h, cy - h), (cx + h, cy - h), (cx + h, cy + h), (cx - h, cy + h)]
    if shape == "triangle":
        return [
            (cx + r * math.cos(a), cy - r * math.sin(a)) for a in (math.pi / 2 + k * 2 * math.pi / 3 for k in range(3))
        ]
    if shape == "star":
        points = []
        for k in range(10):
            a = math.pi / 2 + k * math.pi / 5
            rr = r if k % 2 == 0 else r * 0.42
            points.append((cx + rr * math.cos(a), cy - rr * math.sin(a)))
        return points
    if shape == "cross":
        w = r * 0.33  # half the arm thickness
        return [
            (cx - w, cy - r),
            (cx + w, cy - r),
            (cx + w, cy - w),
            (cx + r, cy - w),
            (cx + r, cy + w),
            (cx + w, cy + w),
            (cx + w, cy + r),
            (cx - w, cy + r),
            (cx - w, cy + w),
            (cx - r, cy + w),
            (cx - r, cy - w),
            (cx - w, cy - w),
        ]
    raise ValueError(f"unknown shape {shape!r}")


def render_frame(scene: Scene, t: float, size: tuple[int, int]) -> Image.Image:
    """The scene at time ``t`` in [0, 1], as an RGB image of ``size`` (width, height)."""
    from PIL import Image, ImageDraw

    width, height = size
    image = Image.new("RGB", size, BACKGROUND_COLOURS[scene.polarity][scene.background])
    draw = ImageDraw.Draw(image)
    fx, fy = scene.centre(t)
    cx, cy, r = fx * width, fy * height, scene.radius * min(width, height)
    fill = SHAPE_COLOURS[scene.polarity][scene.colour]
    if scene.shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    else:
        draw.polygon(_outline(scene.shape, cx, cy, r), fill=fill)
    return image


def render(scene: Scene, n_frames: int, size: tuple[int, int] = (128, 96)) -> list[Image.Image]:
    """``n_frames`` frames; a moving shape goes from ``start`` (first) to ``end`` (last)."""
    if n_frames < 1:
        raise ValueError("n_frames must be at least 1")
    times = [i / (n_frames - 1) if n_frames > 1 else 0.0 for i in range(n_frames)]
    return [render_frame(scene, t, size) for t in times]


# --- the demo clip -----------------------------------------------------------------------------


def make_demo_clip(
    path: Path | str,
    clip_scenes: Sequence[Scene] = CLIP_SCENES,
    seconds_per_scene: float = CLIP_SECONDS_PER_SCENE,
    fps: int = CLIP_FPS,
    size: tuple[int, int] = CLIP_SIZE,
) -> Path:
    """An mp4 showing ``clip_scenes`` one after another, ``seconds_per_scene`` each; scene k
    covers [k * seconds_per_scene, (k + 1) * seconds_per_scene)."""
    import av

    from ffai.media import video_encoder

    path = Path(path)
    frames_per_scene = round(seconds_per_scene * fps)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(video_encoder(), rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.codec_context.thread_count = 1  # one thread: the same bytes on every machine
        index = 0
        for scene in clip_scenes:
            for image in render(scene, frames_per_scene, size):
                frame = av.VideoFrame.from_image(image)
                frame.pts = index
                index += 1
                container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path
