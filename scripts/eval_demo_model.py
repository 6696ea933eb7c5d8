"""Exact-caption accuracy of the demo checkpoint on held-out synthetic scenes, through the engine.

The model is loaded by ``ffai_smolvlm`` (not transformers), as ``ffai caption`` loads it. Each
held-out scene (geometry cells the training never drew, see ``demo_scenes.split_of``) is asked
once: a quarter as a still image (``split=True``), the rest as a window of 1-8 frames
(``split=False``), rendered at canvas sizes partly unseen in training. A caption counts only
if it equals ``demo_scenes.caption(scene)`` exactly (surrounding spaces aside).

Usage: python scripts/eval_demo_model.py [--model models/smolvlm-demo] [--n 500] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/ is not a package

import demo_scenes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "smolvlm-demo"
DEFAULT_N = 500
DEFAULT_SEED = 1
STILL_SHARE = 0.25
MAX_FRAMES = 8
# 128x96 and 96x96 are training canvases; the others are not.
CANVASES = ((128, 96), (96, 96), (120, 90), (112, 112), (100, 75), (80, 80))
MAX_NEW_TOKENS = 16  # a caption is about ten tokens


@dataclass(frozen=True)
class Item:
    scene: demo_scenes.Scene
    n_frames: int
    split: bool  # True: a still image through the split path
    canvas: tuple[int, int]

    @property
    def kind(self) -> str:
        return "still" if self.split else f"{self.n_frames}-frame window"


@dataclass
class Result:
    correct: int = 0
    total: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [correct, total]
    failures: list[tuple[Item, str]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def add(self, item: Item, text: str) -> None:
        ok = text.strip() == demo_scenes.caption(item.scene)
        kind = "still" if item.split else "window"
        counts = self.by_kind.setdefault(kind, [0, 0])
        counts[0] += ok
        counts[1] += 1
        self.correct += ok
        self.total += 1
        if not ok:
            self.failures.append((item, text))


def items(n: int, seed: int) -> list[Item]:
    """``n`` held-out questions, the same for the same seed."""
    rng = random.Random(f"eval/{seed}")
    out = []
    for scene in demo_scenes.scenes("heldout", n, seed):
        split = rng.random() < STILL_SHARE
        n_frames = 1 if split else rng.randint(1, MAX_FRAMES)
        out.append(Item(scene, n_frames, split, rng.choice(CANVASES)))
    return out


def evaluate(model_dir: Path | str, n: int = DEFAULT_N, seed: int = DEFAULT_SEED, model=None) -> Result:
    """Ask the model about ``n`` held-out scenes; ``model`` may be an already loaded engine model."""
    from ffai.engine import DecodingOptions, RuntimeOptions
    from ffai_smolvlm import ENGINE

    if model is None:
        model = ENGINE.load(Path(model_dir), RuntimeOptions(device="cpu"))
    options = DecodingOptions(max_new_tokens=MAX_NEW_TOKENS)
    result = Result()
    for item in items(n, seed):
        images = demo_scenes.render(item.scene, item.n_frames, item.canvas)
        result.add(item, model.describe(images, options, split=item.split))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=DEFAULT_N)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    result = evaluate(args.model, args.n, args.seed)
    for item, text in result.failures[:10]:
        print(f"  wrong ({item.kind}, {item.canvas[0]}x{item.canvas[1]}): expected {demo_scenes.caption(item.scene)!r}, got {text.strip()!r}")
    parts = ", ".join(f"{kind}s {c}/{t}" for kind, (c, t) in sorted(result.by_kind.items()))
    print(f"held-out exact-caption accuracy: {result.correct}/{result.total} = {100 * result.accuracy:.1f} % ({parts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
