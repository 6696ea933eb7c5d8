"""Exact-caption accuracy of the demo checkpoint on held-out synthetic scenes, through the engine.

The model is loaded by ``ffai.engines.smolvlm`` (not transformers), as ``ffai caption`` loads it. Each
held-out scene (geometry cells the training never drew, see ``demo_scenes.split_of``) is asked
once: a quarter as a still image, the rest as a window of 1-8 frames, rendered at canvas sizes partly unseen in training: half near-square (4:3
or 1:1), half clearly not (portrait, 16:9, 2:1, 641x359...). Scenes are of both polarities,
about half each. A caption counts only if it equals ``demo_scenes.caption(scene)`` exactly
(surrounding spaces aside); accuracy is also reported per group: each polarity, and the
non-square frames (long side at least NON_SQUARE times the short side) of both polarities.

``scripts/eval_demo_model.py`` prints it, the training script records it in RECIPE.md, the
tests check it on a small sample and the bench's quality gate asks both arms the same items.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from ffai.bench import demo_scenes
from ffai.engines.contract import DecodingOptions, Request

DEFAULT_N = 500
DEFAULT_SEED = 1
STILL_SHARE = 0.25
MAX_FRAMES = 8
# 128x96 and 96x96 are training canvases; the others are not.
CANVASES = ((128, 96), (96, 96), (120, 90), (112, 112), (100, 75), (80, 80))
# Training draws aspect ratios at random (demo_scenes.random_canvas), so these exact sizes are
# unlikely ever to have been seen.
NON_SQUARE_CANVASES = (
    (641, 359),
    (359, 641),
    (320, 180),
    (180, 320),
    (200, 100),
    (100, 200),
    (150, 100),
    (100, 150),
    (427, 240),
    (250, 125),
    (96, 160),
    (213, 120),
)
NON_SQUARE_SHARE = 0.5
NON_SQUARE = 1.5  # the aspect ratio from which a frame counts as non-square
NON_SQUARE_GROUP = "non-square"
GROUPS = (*demo_scenes.POLARITIES, NON_SQUARE_GROUP)
MAX_NEW_TOKENS = 16  # a caption is about ten tokens


@dataclass(frozen=True)
class Item:
    scene: demo_scenes.Scene
    n_frames: int
    still: bool  # True: a still image, else a window of n_frames
    canvas: tuple[int, int]

    @property
    def kind(self) -> str:
        return "still" if self.still else f"{self.n_frames}-frame window"

    @property
    def answer(self) -> str:
        return demo_scenes.caption(self.scene)

    @property
    def groups(self) -> tuple[str, ...]:
        """The report groups this item counts in: its polarity, and non-square when it is."""
        square = demo_scenes.aspect_ratio(self.canvas) < NON_SQUARE
        return (self.scene.polarity,) if square else (self.scene.polarity, NON_SQUARE_GROUP)

    def images(self) -> list:
        return demo_scenes.render(self.scene, self.n_frames, self.canvas)

    @property
    def times(self) -> tuple[float, ...] | None:
        """None for a still; a window's frames one second apart."""
        return None if self.still else tuple(float(i) for i in range(self.n_frames))

    def request(self, options: DecodingOptions) -> Request:
        return Request.of(self.images(), self.times, options)


@dataclass
class Result:
    correct: int = 0
    total: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [correct, total]
    by_group: dict[str, list[int]] = field(default_factory=dict)  # one of GROUPS -> [correct, total]
    failures: list[tuple[Item, str]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def group_accuracy(self, group: str) -> float:
        correct, total = self.by_group.get(group, (0, 0))
        return correct / total if total else 0.0

    def add(self, item: Item, text: str) -> None:
        ok = text.strip() == item.answer
        kind = "still" if item.still else "window"
        for counts in (
            self.by_kind.setdefault(kind, [0, 0]),
            *(self.by_group.setdefault(g, [0, 0]) for g in item.groups),
        ):
            counts[0] += ok
            counts[1] += 1
        self.correct += ok
        self.total += 1
        if not ok:
            self.failures.append((item, text))


def items(n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> list[Item]:
    """``n`` held-out questions, the same for the same seed."""
    rng = random.Random(f"eval/{seed}")
    out = []
    for scene in demo_scenes.scenes("heldout", n, seed):
        still = rng.random() < STILL_SHARE
        n_frames = 1 if still else rng.randint(1, MAX_FRAMES)
        canvases = NON_SQUARE_CANVASES if rng.random() < NON_SQUARE_SHARE else CANVASES
        out.append(Item(scene, n_frames, still, rng.choice(canvases)))
    return out


def evaluate(model_dir: Path | str, n: int = DEFAULT_N, seed: int = DEFAULT_SEED, model=None) -> Result:
    """Ask the model about ``n`` held-out scenes; ``model`` may be an already loaded engine model."""
    from ffai.engines.contract import RuntimeOptions
    from ffai.run.inline import InlineEngine

    if model is None:
        model = InlineEngine.load("smolvlm", Path(model_dir), RuntimeOptions(device="cpu"))
    options = DecodingOptions(max_new_tokens=MAX_NEW_TOKENS)
    result = Result()
    for item in items(n, seed):
        result.add(item, model(item.request(options)).text)
    return result
