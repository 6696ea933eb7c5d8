"""``ffai sheet``: the contact sheet of a JSON track, made again from its source without a model."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ffai.cli.options import NeverOverwrite, Overwrite, Quiet, Verbose, settle

Track = Annotated[str, typer.Argument(help="A JSON track written by `ffai caption -f json`.")]
Page = Annotated[Optional[str], typer.Option("-o", "--output", help="The page (html); '-' or none: stdout.")]
Source = Annotated[
    Optional[str],
    typer.Option("-i", "--input", help="The track's source video or image, if not where the track says."),
]


def sheet(
    track: Track,
    output: Page = None,
    source: Source = None,
    overwrite: Overwrite = False,
    never_overwrite: NeverOverwrite = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Make the contact sheet (html) of a JSON track from its source, without a model."""
    from ffai.outputs import sheet_build

    settle(verbose, quiet, overwrite, never_overwrite)
    sheet_build.build(track, output, overwrite=overwrite, source=source)
