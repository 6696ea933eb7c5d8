"""README figures and flags checked against the code that produces them.

Documentation that states a figure drifts when the code changes; these tests tie the README's
statements about the bench's inputs and the CLI's options to the code itself."""

from __future__ import annotations

import re
from pathlib import Path

import click
import typer.main

from ffai.bench import cases
from ffai.cli import app

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_still_case_tile_count_matches_the_processor():
    from ffai_smolvlm.preprocess import ProcessorConfig, preprocess_images

    m = re.search(r"`still` \((\d+)×(\d+): (\d+)×(\d+) tiles \+ the global image = (\d+)\)", README)
    assert m, "README no longer states the still case's tiles in the checked form"
    width, height, cols, rows, total = map(int, m.groups())
    assert (width, height) == cases.STILL_SIZE
    processor = ProcessorConfig.from_dir(Path(__file__).parent / "data" / "smolvlm-256m-instruct")
    batch = preprocess_images([cases.synthetic_image(2, cases.STILL_SIZE)], processor, split=True)
    assert batch.grids == [(rows, cols)]
    assert batch.tiles.shape[0] == rows * cols + 1 == total


def _command(path: list[str]) -> click.Command:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def test_every_caption_option_is_in_the_readme():
    """Each option of `ffai caption` appears (one of its spellings, in backticks) in the README."""
    missing = []
    for param in _command(["caption"]).params:
        spellings = [*param.opts, *param.secondary_opts]
        if not any(re.search(rf"`{re.escape(s)}[ `=/]", README) or f"`{s}`" in README for s in spellings):
            missing.append("/".join(spellings))
    assert not missing, f"options of `ffai caption` the README does not document: {missing}"
