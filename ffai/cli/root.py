"""The ``ffai`` app: its commands, its global options (-v, -q, --version), and ``run``, where
every way a command can end becomes an exit status and at most one line on stderr."""

from __future__ import annotations

import sys
import traceback
from typing import Annotated, List, Optional

import typer

from ffai import messages
from ffai.bench.cli import bench_app  # light: no torch, transformers or av at import
from ffai.cli.caption import caption
from ffai.cli.console import PRINTER, State, error
from ffai.cli.engines import engines
from ffai.cli.models import models_app
from ffai.cli.options import Quiet, Verbose
from ffai.cli.sheet import sheet
from ffai.errors import FfaiError
from ffai.kit import host
from ffai.run import interrupts

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_errors

app = typer.Typer(
    name="ffai",
    help="Caption and question images and video with a local vision-language model.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"ffai {version('ffai')}")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: Verbose = False,
    quiet: Quiet = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    State.verbose = verbose
    State.quiet = quiet
    messages.listen(PRINTER)  # then logging's last-resort handler (stderr, -q or not) is not used


# The commands, in the order `ffai --help` lists them.
app.command()(engines)
app.add_typer(bench_app, name="bench")
app.add_typer(models_app, name="models")
app.command()(caption)
app.command()(sheet)


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def main(argv: Optional[List[str]] = None) -> None:
    host.share_cores()  # before anything imports torch, and inherited by the processes ffai starts
    sys.exit(run(argv))


def _bare_ray(argv: List[str]) -> List[str]:
    """``--ray`` alone (last, or before another option) means ``--ray auto``: a typer option
    cannot take an optional value, and an address never starts with '-'."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--ray" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append("auto")
    return out


def run(argv: Optional[List[str]] = None) -> int:
    """Run the CLI and return its exit status (used by main and by tests)."""
    argv = _bare_ray(sys.argv[1:] if argv is None else list(argv))
    try:
        with interrupts.caught():  # a Ctrl-C that a finaliser swallowed still stops the run
            status = app(args=argv, prog_name="ffai", standalone_mode=False)
        if status == INTERRUPTED:  # typer catches Ctrl-C itself and returns this code, saying nothing
            error("interrupted")
        return status if isinstance(status, int) else 0
    except FfaiError as e:
        if State.verbose:
            traceback.print_exc()
        error(str(e))
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except click_errors.NoArgsIsHelpError as e:
        typer.echo(e.ctx.get_help())
        return 0
    except click_errors.UsageError as e:
        error(" ".join(e.format_message().split()))
        return 2
    except (KeyboardInterrupt, typer.Abort):
        error("interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        return 141
