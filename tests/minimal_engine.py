"""A second, minimal engine, registered through the ``ffai.engines`` entry point by the tests
(``register_palette_engine``): the contract in ``ffai.engines.contract`` is all it implements.

It names the dominant colour of each picture from its checkpoint's ``config.json`` palette
({"context": frames it can take, "colours": {name: [r, g, b]}}): a "look" stage (mean colour,
nearest palette entry) and a "say" stage (the answer, one token per colour).

Its bench hooks (``BENCH``, ``ffai.bench.hooks.BenchHooks``) let ``ffai bench vlm --engine
palette`` run: a reference of its own (numpy's mean colour, not Pillow's ImageStat), a checkpoint
writer, and probes (features: each picture's mean colour; logits: minus its squared distance to
each palette colour).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from PIL import ImageStat

from ffai.engines.contract import Answer, DecodingOptions, EngineInfo, Request, StageSpec
from ffai.errors import ModelError, UsageError

NAME = "palette"


def read_palette(model_dir) -> dict:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        return {"context": int(config["context"]), "colours": {k: tuple(v) for k, v in config["colours"].items()}}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{model_dir}/config.json: not a palette checkpoint ({e})") from e


# Near the demo clip's four backgrounds, as its frames average out with their shapes.
COLOURS = {
    "red": [220, 30, 30],
    "blue": [50, 40, 110],
    "black": [25, 25, 20],
    "green": [35, 100, 50],
    "grey": [100, 85, 95],
}


def write_checkpoint(folder: Path, context: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"context": context, "colours": COLOURS}), encoding="utf-8")
    return folder


class PaletteEngine:
    info = EngineInfo(NAME, "vlm", "experimental", "test only: names each picture's colour", "palette-model")
    bench = f"{__name__}:BENCH"

    def check_window(self, model_dir: Path, frames: int, options: DecodingOptions) -> None:
        context = read_palette(model_dir)["context"]
        if frames > context:
            raise UsageError(f"--window {frames}: the palette model takes at most {context} frames")

    def stages(self) -> tuple[StageSpec, ...]:
        return (StageSpec("look", f"{__name__}:look_stage", "look"), StageSpec("say", f"{__name__}:say_stage", "say"))


ENGINE = PaletteEngine()


@dataclass(frozen=True)
class Looked:
    colours: tuple[int, ...]  # palette index of each picture
    request: Request
    means: tuple[tuple[float, ...], ...] = ()  # each picture's mean (r, g, b)


def look_stage(model_dir: str, runtime):
    names = list(read_palette(model_dir)["colours"].values())

    def look(request: Request) -> Looked:
        means = tuple(tuple(ImageStat.Stat(image.convert("RGB")).mean) for image in request.images)
        return Looked(tuple(nearest(mean, names) for mean in means), request, means)

    return look


def nearest(mean, colours: list) -> int:
    return min(range(len(colours)), key=lambda i: sum((a - b) ** 2 for a, b in zip(mean, colours[i])))


def say_stage(model_dir: str, runtime):
    names = list(read_palette(model_dir)["colours"])

    def say(looked: Looked, on_text=None) -> Answer:
        text = answer_text([names[i] for i in looked.colours], looked.request)
        if on_text is not None:
            on_text(text)
        return Answer(text, looked.colours)

    return say


def answer_text(words: list[str], request: Request) -> str:
    if request.still:
        return f"a {words[0]} picture"
    start, end = request.span
    return f"{', '.join(words)} from {start:g} s to {end:g} s"


# --- bench hooks ---------------------------------------------------------------------------


class PaletteReference:
    """The bench's reference arm: the mean colour by numpy over the pixels, not Pillow's ImageStat."""

    name = "reference"

    def __init__(self, model_dir: Path, cores: int) -> None:
        self.model_dir = model_dir

    def load(self) -> None:
        self.palette = read_palette(self.model_dir)["colours"]

    def answer(self, item, options: DecodingOptions) -> tuple[list[int], str]:
        import numpy as np

        colours = list(self.palette.values())
        means = [np.asarray(image.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(0) for image in item.images]
        tokens = [nearest(mean, colours) for mean in means]
        return tokens, answer_text([list(self.palette)[i] for i in tokens], item.request(options))

    def answer_all(self, items: list, options: list[DecodingOptions]) -> dict[str, tuple[list[int], str]]:
        return {it.id: self.answer(it, o) for it, o in zip(items, options)}

    def clip(self, path: Path) -> dict[str, list[int]]:
        from ffai.bench import cases

        return {item.id: self.answer(item, cases.decoding())[0] for item in cases.clip_items(path)}

    def info(self) -> dict:
        return {"implementation": "numpy mean colour"}

    def close(self) -> None:
        pass


class PaletteBench:
    checkpoint_kinds = ("tiny",)

    def check_reference(self) -> None:
        pass  # numpy only

    def checkpoint_fingerprint(self, kind: str) -> str:
        return hashlib.sha256(json.dumps([kind, COLOURS], sort_keys=True).encode()).hexdigest()

    def write_checkpoint(self, kind: str, out: Path) -> None:
        write_checkpoint(out)

    def reference(self, model_dir: Path, cores: int) -> PaletteReference:
        return PaletteReference(model_dir, cores)

    def features_and_logits(self, model, request: Request):
        """(pictures, 3) mean colours; (colours,) minus the first picture's squared distances."""
        import torch

        looked = model.through(request, "look")
        palette = torch.tensor(list(read_palette(model.model_dir)["colours"].values()), dtype=torch.float64)
        features = torch.tensor(looked.means, dtype=torch.float64)  # (pictures, 3)
        return features, -((palette - features[0]) ** 2).sum(-1)

    def timed_tokens(self, model, request: Request) -> tuple[list[int], float, list[float]]:
        """The say stage gives every token at once: one first-token time, no decode steps."""
        looked = model.through(request, "look")
        start = time.perf_counter()
        answer = model["say"](looked)
        return list(answer.token_ids), time.perf_counter() - start, []

    def decode_weights(self, model_dir: Path) -> int:
        return 3 * len(read_palette(model_dir)["colours"])


BENCH = PaletteBench()


def register_engine(folder: Path, name: str, target: str) -> Path:
    """A dist-info in ``folder`` whose entry point ``name`` in group ffai.engines names ``target``
    ("module:attr"); a process with ``folder`` on its path finds the engine as an installed one."""
    dist = f"ffai_test_engine_{name.replace('-', '_')}"
    info = folder / f"{dist}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[ffai.engines]\n{name} = {target}\n")
    return folder


def register_palette_engine(folder: Path) -> Path:
    return register_engine(folder, NAME, "minimal_engine:ENGINE")
