"""The ``ffai`` command line: parse, validate cheaply, call one library function per command.

Every FfaiError becomes one line on stderr (``ffai: error: …``) and its exit code; usage
errors exit 2; Ctrl-C exits 130. Tracebacks only with ``-v``.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import traceback
from dataclasses import asdict
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from ffai import messages
from ffai.errors import FfaiError, UsageError
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


class _State:
    verbose = False
    quiet = False


# Options that more than one command (or the app and a command) take, declared once.
Verbose = Annotated[bool, typer.Option("-v", "--verbose", help="Show tracebacks and more detail.")]
Quiet = Annotated[bool, typer.Option("-q", "--quiet", help="Only errors on stderr.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print a JSON array instead of a table.")]
ModelName = Annotated[str, typer.Argument(help="Model name (see `ffai models list`).")]
Overwrite = Annotated[bool, typer.Option("-y", help="Overwrite existing outputs.")]
NeverOverwrite = Annotated[bool, typer.Option("-n", help="Never overwrite existing outputs (the default).")]


def _settle(verbose: bool, quiet: bool, overwrite: bool, never_overwrite: bool) -> None:
    """A writing command's flags that hold across commands: -v/-q given after it, and -y against -n."""
    _State.verbose = _State.verbose or verbose
    _State.quiet = _State.quiet or quiet
    if overwrite and never_overwrite:
        raise UsageError("-y and -n contradict each other")


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
    _State.verbose = verbose
    _State.quiet = quiet
    messages.listen(_PRINTER)  # then logging's last-resort handler (stderr, -q or not) is not used


def _print(message: messages.Message) -> None:
    """The one place a message becomes a line on stderr; -q keeps only the errors."""
    if message.level == "error" or not _State.quiet:
        print(message.line(), file=sys.stderr, flush=True)


def error(text: str) -> None:
    """The command's own one-line error (an FfaiError, bad usage, Ctrl-C)."""
    _print(messages.Message("error", text))


class _Printer(logging.Handler):
    """What the library says (``ffai.messages``, ``ffai.media``'s skipped packets ...)."""

    def emit(self, record: logging.LogRecord) -> None:
        _print(messages.Message.from_record(record))


_PRINTER = _Printer(messages.NOTE)


@app.command()
def engines(as_json: AsJson = False) -> None:
    """List the engines that can run, by name, and which kernels each runs here in each dtype."""
    from ffai.engines import registry

    infos = registry.engine_infos()
    cpu = host.cpu_info()
    # Which dtypes run at least as fast as float32 is the CPU's doing (ffai.kit.host), the same for
    # every engine; float32 is the exact one. Which kernels run them is each engine's own report.
    fast = list(cpu.fast_dtypes())
    kernels = {}
    for i in infos:
        report = getattr(registry.get_engine(i.name), "kernels", None)
        kernels[i.name] = report(cpu.flags) if report is not None else None
    if as_json:
        rows = [{**asdict(i), "fast_dtypes": fast, "kernels": kernels[i.name]} for i in infos]
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    table = Table(title="ffai engines")
    # Names and states in the table, one line each; the descriptions beneath it, wrapped to the
    # terminal (in a column they would be one word wide on 80 columns).
    for column in ("name", "task", "status", "default model"):
        table.add_column(column, no_wrap=True)
    for i in infos:
        table.add_row(i.name, i.task, i.status, i.default_model)
    console = Console(highlight=False)
    console.print(table)
    for i in infos:
        console.print(f"{i.name}: {i.description}", markup=False)
    console.print(f"CPU: {cpu.describe()}; fast dtypes here: {', '.join(fast)}", markup=False)
    for name, report in kernels.items():
        if report is None:
            continue
        console.print(
            f"{name} on this CPU: float32 for exact output (archives, evaluation); "
            f"--dtype {report['throughput_dtype']} for throughput",
            markup=False,
        )
        for dtype, groups in report["dtypes"].items():
            for g in groups:
                console.print(f"  {dtype:<8}  {g['layers']}: {g['kernel']} ({g['why']})", markup=False)


from ffai.bench.cli import bench_app  # noqa: E402  (light: no torch, transformers or av at import)

app.add_typer(bench_app, name="bench")

models_app = typer.Typer(help="List, download and verify model checkpoints.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _human_size(n: int) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _pinning(files: list[dict]) -> str:
    """How many files the manifest pins by sha256, then how many of the others were verified against the hub."""
    rest = [f for f in files if f["pin"] != "sha256"]
    text = f"{len(files) - len(rest)}/{len(files)}"
    if rest:
        text += f", hub {sum(f['verified'] == 'hub' for f in rest)}/{len(rest)}"
    return text


@models_app.command("list")
def models_list(as_json: AsJson = False) -> None:
    """Known models: engine, licence, size, what the manifest pins and where each was found."""
    from ffai import models
    from ffai.models import verification

    rows = []
    for m in models.manifests():
        folder = models.find(m)
        verified = verification.verified_against(m, folder) if folder else {}
        files = [
            {"path": f.path, "size": f.size, "sha256": f.sha256, "sha256_prefix": f.sha256_prefix, "pin": f.pin}
            | {"verified": verified.get(f.path)}
            for f in m.files
        ]
        rows.append(
            {
                "name": m.name,
                "engine": m.engine,
                "license": m.license,
                "size": m.size,
                "size_known": m.size_known,
                "path": str(folder) if folder else None,
                "pinned": sum(f.pin == "sha256" for f in m.files),
                "hub_verified": [f["path"] for f in files if f["pin"] != "sha256" and f["verified"] == "hub"],
                "files": files,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    caption = (
        "pinned: files the manifest pins by sha256; hub: of the others, those verified against the hub's hash. "
        "Every model decodes greedily by default, even where its generation_config.json asks for sampling "
        "(Qwen3-VL's does): ffai samples only with --temperature and --seed"
    )
    table = Table(title="ffai models", caption=caption)
    for column in ("name", "engine", "licence", "size", "pinned", "found at"):
        # A name cut short cannot be typed back, nor a path copied: those fold, never end in "…".
        table.add_column(
            column,
            no_wrap=column in ("name", "engine", "size"),
            overflow="fold" if column == "found at" else "ellipsis",
            min_width=len("missing") if column == "found at" else None,  # never "missi/ng"
        )
    for r in rows:
        size = _human_size(r["size"]) + ("" if r["size_known"] else " +")
        table.add_row(r["name"], r["engine"], r["license"], size, _pinning(r["files"]), r["path"] or "missing")
    Console(highlight=False).print(table)


def _manifest(name: str | None):
    from ffai import models
    from ffai.engines import registry

    # No name: the default engine's default model (what `ffai caption` uses once it is here).
    name = name or registry.get_engine().info.default_model
    manifest = models.find_manifest(name)
    if manifest is None:
        known = ", ".join(m.name for m in models.manifests())
        raise UsageError(f"no model named {name!r} (known: {known})")
    return manifest


@models_app.command("pull")
def models_pull(
    name: Annotated[
        Optional[str], typer.Argument(help="Model name (see `ffai models list`; default: the default model).")
    ] = None,
) -> None:
    """Download a model into the Hugging Face cache, resuming, each file checked against its pinned sha256 or, where
    the manifest pins none, the hash the hub announces."""
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TransferSpeedColumn
    from rich.progress import Progress as RichProgress

    from ffai.models import hub

    manifest = _manifest(name)
    if not manifest.hf_repo:
        raise UsageError(f"{manifest.name} ships with ffai; there is nothing to download")
    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        disable=not sys.stderr.isatty() or _State.quiet,
    )
    tasks: dict[str, int] = {}

    def progress(path: str, done: int, total: int) -> None:
        if path not in tasks:
            tasks[path] = bar.add_task(path, total=total)
        bar.update(tasks[path], completed=done)

    with bar:
        folder = hub.pull(manifest, progress=progress)
    typer.echo(str(folder))


@models_app.command("verify")
def models_verify(name: ModelName) -> None:
    """Re-hash a model's files on disk (against the manifest, or the hub's recorded hash) and record the result."""
    from ffai.models import hub

    results = hub.verify(_manifest(name))
    for r in results:
        typer.echo(f"{r.status:16} {r.against or '-':9} {r.path}")
    bad = [r.path for r in results if r.status != "ok"]
    if bad:
        raise FfaiError(f"{name}: {len(bad)} of {len(results)} files failed verification")


@app.command()
def caption(
    inputs: Annotated[
        List[str],
        typer.Option(
            "-i", "--input", help="Image or video, folder, quoted glob or @list.txt (repeatable; see docs/caption.md)."
        ),
    ],
    output: Annotated[
        Optional[str],
        typer.Option(
            "-o",
            "--output",
            help="Track file, '-' for stdout; with several inputs a pattern such as '{stem}.srt' or 'out/{reldir}/{stem}.srt'.",
        ),
    ] = None,
    fmt: Annotated[
        Optional[str],
        typer.Option(
            "-f",
            "--format",
            help="srt, vtt, json, jsonl, txt or html; or mkv, mp4, mov, webm: the video with the captions as a subtitle stream (default: from -o, else txt).",
        ),
    ] = None,
    language: Annotated[
        Optional[str],
        typer.Option(
            "--language", help="Language of the subtitle stream of an mkv/mp4/mov/webm output (default: und)."
        ),
    ] = None,
    partial: Annotated[
        bool,
        typer.Option(
            "--partial", help="With -f jsonl on stdout: each cue's text so far, as generated, before the cue."
        ),
    ] = False,
    fps: Annotated[float, typer.Option("--fps", help="Frames sampled per second of video.")] = 1.0,
    window: Annotated[int, typer.Option("--window", help="Consecutive samples captioned together as one cue.")] = 8,
    window_as: Annotated[
        Optional[str],
        typer.Option(
            "--window-as",
            help="How a window reaches the model: video (one clip with its frame times) or images (separate pictures); default: video where the model supports it.",
        ),
    ] = None,
    min_pixels: Annotated[
        Optional[int],
        typer.Option(
            "--min-pixels",
            help="Fewest pixels a still is resized to, for models sized by a pixel budget (Qwen3-VL; default: the model's).",
        ),
    ] = None,
    max_pixels: Annotated[
        Optional[int],
        typer.Option(
            "--max-pixels",
            help="Most pixels a still is resized to, for models sized by a pixel budget (default: the model's).",
        ),
    ] = None,
    frame_min_pixels: Annotated[
        Optional[int],
        typer.Option(
            "--frame-min-pixels",
            help="Fewest pixels each frame of a window is resized to (pixel-budget models; default: the model's).",
        ),
    ] = None,
    frame_max_pixels: Annotated[
        Optional[int],
        typer.Option(
            "--frame-max-pixels",
            help="Most pixels each frame of a window is resized to (pixel-budget models; default: the model's).",
        ),
    ] = None,
    start: Annotated[float, typer.Option("-ss", help="Start at this many seconds.")] = 0.0,
    duration: Annotated[Optional[float], typer.Option("-t", help="Caption this many seconds.")] = None,
    max_frames: Annotated[Optional[int], typer.Option("--max-frames", help="Stop after this many samples.")] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help="Engine name (see `ffai engines`).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Model name or checkpoint folder.")] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", help="Question to ask instead of a caption.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Longest answer, in tokens.")] = 64,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed; required for sampling.")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature (0: greedy).")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Sample among the k most likely tokens (0: all).")] = 0,
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="float32 (exact), or opt-in bfloat16 or int8 (faster on CPUs built for them, rounding differs; see `ffai engines`).",
        ),
    ] = "float32",
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")] = "auto",
    threads: Annotated[
        Optional[int],
        typer.Option("--threads", help="Torch threads per process running stages (default: the cores shared out)."),
    ] = None,
    compile_: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="With --dtype int8 or bfloat16: run the decode step compiled for this machine (once, a minute or two, cached; needs a C++ compiler), 1.5-2x faster a token.",
        ),
    ] = False,
    placement: Annotated[
        str,
        typer.Option(
            "--placement",
            help="Where the model runs: auto, inline (this process) or workers (worker processes); auto: workers for video on more than 2 cores.",
        ),
    ] = "auto",
    max_in_flight: Annotated[int, typer.Option("--max-in-flight", help="Windows in the pipeline at once.")] = 2,
    max_lag: Annotated[
        Optional[float],
        typer.Option(
            "--max-lag",
            help="Live sources: drop whole windows that fall this many seconds behind the source (default 10).",
        ),
    ] = None,
    no_drop: Annotated[
        bool,
        typer.Option("--no-drop", help="Live sources: caption every window; decoding pauses while the model works."),
    ] = False,
    stall_timeout: Annotated[
        Optional[float],
        typer.Option("--stall-timeout", help="Live sources: no video for this many seconds is an error (default 10)."),
    ] = None,
    ray: Annotated[
        Optional[str],
        typer.Option(
            "--ray",
            metavar="[ADDRESS|local]",
            help="Caption on a Ray cluster: alone, $RAY_ADDRESS or the one `ray start --head` started here; 'local': a Ray of its own for this run; or the cluster's ADDRESS. Needs pip install 'ffai\\[ray]'.",
        ),
    ] = None,
    ray_actors: Annotated[
        Optional[int], typer.Option("--ray-actors", help="Engine actors (default: one per CPU, or one per GPU).")
    ] = None,
    ray_cpus_per_actor: Annotated[
        Optional[float],
        typer.Option("--ray-cpus-per-actor", help="CPUs, and torch threads, per engine actor (default: 1)."),
    ] = None,
    ray_gpus_per_actor: Annotated[
        Optional[float],
        typer.Option(
            "--ray-gpus-per-actor", help="GPUs per engine actor (default: 1 if the cluster has GPUs, else 0)."
        ),
    ] = None,
    overwrite: Overwrite = False,
    never_overwrite: NeverOverwrite = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Skip inputs the run record says are done; redo unfinished ones.")
    ] = False,
    run_log: Annotated[
        Optional[str],
        typer.Option("--run-log", help="Run record (JSON Lines; default: ffai-run.jsonl beside the outputs)."),
    ] = None,
    retries: Annotated[
        int, typer.Option("--retries", help="Tries again an input whose worker died, this many times.")
    ] = 2,
    progress: Annotated[
        Optional[bool],
        typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal)."),
    ] = None,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Caption images and videos; write timed caption tracks."""
    from ffai.engines.contract import DecodingOptions, RuntimeOptions
    from ffai.run import jobs
    from ffai.run.options import CaptionOptions

    _settle(verbose, quiet, overwrite, never_overwrite)
    options = CaptionOptions(
        engine=engine,
        model=model,
        fps=fps,
        window=window,
        start=start,
        duration=duration,
        max_frames=max_frames,
        decoding=DecodingOptions(
            prompt=prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            window_as=window_as,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            frame_min_pixels=frame_min_pixels,
            frame_max_pixels=frame_max_pixels,
        ),
        runtime=RuntimeOptions(dtype=dtype, device=device, threads=threads, compile=compile_),
        max_in_flight=max_in_flight,
        placement=placement,
        **_live_options(max_lag, no_drop, stall_timeout),
    )
    make_backend = None
    ray_flags = (ray_actors, ray_cpus_per_actor, ray_gpus_per_actor)
    if ray is not None:
        from ffai.ray.backend import RayBackend, RayResources, import_ray

        if partial:
            raise UsageError("--partial is not available with --ray: answers come back from the cluster whole")
        import_ray()  # without the extra, say so before any work
        resources = RayResources(*ray_flags)
        make_backend = functools.partial(RayBackend, address=ray, resources=resources)
    elif any(flag is not None for flag in ray_flags):
        raise UsageError("--ray-actors, --ray-cpus-per-actor and --ray-gpus-per-actor need --ray")
    show_progress = sys.stderr.isatty() if progress is None else progress
    failed = jobs.run_caption_jobs(
        inputs,
        output,
        fmt,
        options,
        overwrite=overwrite,
        progress=show_progress and not _State.quiet,
        resume=resume,
        run_log=run_log,
        retries=retries,
        make_backend=make_backend,
        partial=partial,
        language=language,
    )
    if failed:
        raise typer.Exit(1)


@app.command()
def sheet(
    track: Annotated[str, typer.Argument(help="A JSON track written by `ffai caption -f json`.")],
    output: Annotated[
        Optional[str], typer.Option("-o", "--output", help="The page (html); '-' or none: stdout.")
    ] = None,
    source: Annotated[
        Optional[str],
        typer.Option("-i", "--input", help="The track's source video or image, if not where the track says."),
    ] = None,
    overwrite: Overwrite = False,
    never_overwrite: NeverOverwrite = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Make the contact sheet (html) of a JSON track from its source, without a model."""
    from ffai.outputs import sheet_build

    _settle(verbose, quiet, overwrite, never_overwrite)
    sheet_build.build(track, output, overwrite=overwrite, source=source)


def _live_options(max_lag: float | None, no_drop: bool, stall_timeout: float | None) -> dict:
    """CaptionOptions' live-source fields from their flags; left out, the defaults hold."""
    if no_drop and max_lag is not None:
        raise UsageError("--max-lag and --no-drop contradict each other")
    chosen = {"max_lag": None} if no_drop else {} if max_lag is None else {"max_lag": max_lag}
    return chosen if stall_timeout is None else {**chosen, "stall_timeout": stall_timeout}


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def main(argv: Optional[List[str]] = None) -> None:
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
        if _State.verbose:
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
