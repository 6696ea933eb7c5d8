"""Options that more than one command (or the app and a command) take, declared once, and how
a writing command settles them."""

from __future__ import annotations

from typing import Annotated

import typer

from ffai.cli.console import State
from ffai.errors import UsageError

Verbose = Annotated[bool, typer.Option("-v", "--verbose", help="Show tracebacks and more detail.")]
Quiet = Annotated[bool, typer.Option("-q", "--quiet", help="Only errors on stderr.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print a JSON array instead of a table.")]
ModelName = Annotated[str, typer.Argument(help="Model name (see `ffai models list`).")]
Overwrite = Annotated[bool, typer.Option("-y", help="Overwrite existing outputs.")]
NeverOverwrite = Annotated[bool, typer.Option("-n", help="Never overwrite existing outputs (the default).")]


def settle(verbose: bool, quiet: bool, overwrite: bool, never_overwrite: bool) -> None:
    """A writing command's flags that hold across commands: -v/-q given after it, and -y against -n."""
    State.verbose = State.verbose or verbose
    State.quiet = State.quiet or quiet
    if overwrite and never_overwrite:
        raise UsageError("-y and -n contradict each other")
