"""A second, minimal engine, registered through the ``ffai.engines`` entry point by the tests
(``register_palette_engine``): the contract in ``ffai.engine`` is all it implements.

It names the dominant colour of each picture from its checkpoint's ``config.json`` palette
({"context": frames it can take, "colours": {name: [r, g, b]}}): a "look" stage (mean colour,
nearest palette entry) and a "say" stage (the answer, one token per colour).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PIL import ImageStat

from ffai.engine import Answer, DecodingOptions, EngineInfo, Request, StageSpec
from ffai.errors import ModelError, UsageError

NAME = "palette"


def read_palette(model_dir) -> dict:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        return {"context": int(config["context"]), "colours": {k: tuple(v) for k, v in config["colours"].items()}}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{model_dir}/config.json: not a palette checkpoint ({e})") from e


def write_checkpoint(folder: Path, context: int = 8) -> Path:
    # Near the demo clip's four backgrounds, as its frames average out with their shapes.
    colours = {
        "red": [220, 30, 30],
        "blue": [50, 40, 110],
        "black": [25, 25, 20],
        "green": [35, 100, 50],
        "grey": [100, 85, 95],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"context": context, "colours": colours}), encoding="utf-8")
    return folder


class PaletteEngine:
    info = EngineInfo(NAME, "vlm", "experimental", "test only: names each picture's colour", "palette-model")

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


def look_stage(model_dir: str, runtime):
    names = list(read_palette(model_dir)["colours"].values())

    def look(request: Request) -> Looked:
        def nearest(image) -> int:
            mean = ImageStat.Stat(image.convert("RGB")).mean
            return min(range(len(names)), key=lambda i: sum((a - b) ** 2 for a, b in zip(mean, names[i])))

        return Looked(tuple(nearest(image) for image in request.images), request)

    return look


def say_stage(model_dir: str, runtime):
    names = list(read_palette(model_dir)["colours"])

    def say(looked: Looked, on_text=None) -> Answer:
        words = [names[i] for i in looked.colours]
        request = looked.request
        if request.still:
            text = f"a {words[0]} picture"
        else:
            start, end = request.span
            text = f"{', '.join(words)} from {start:g} s to {end:g} s"
        if on_text is not None:
            on_text(text)
        return Answer(text, looked.colours)

    return say


def register_palette_engine(folder: Path) -> Path:
    """A dist-info in ``folder`` whose entry point names ``ENGINE`` in group ffai.engines."""
    info = folder / "ffai_palette_engine-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ffai-palette-engine\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[ffai.engines]\n{NAME} = minimal_engine:ENGINE\n")
    return folder
