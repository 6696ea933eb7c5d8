"""``ffai caption``: its options, each declared once below, and the run they configure
(``ffai.run.jobs.run_caption_jobs``), on this machine or on a Ray cluster."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Annotated, Callable, List, Optional

import typer

from ffai.cli.console import State
from ffai.cli.options import NeverOverwrite, Overwrite, Quiet, Verbose, settle
from ffai.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from ffai.run.options import CaptionOptions

# --- inputs and outputs ---------------------------------------------------------------------

Inputs = Annotated[
    List[str],
    typer.Option(
        "-i", "--input", help="Image or video, folder, quoted glob or @list.txt (repeatable; see docs/caption.md)."
    ),
]
Output = Annotated[
    Optional[str],
    typer.Option(
        "-o",
        "--output",
        help="Track file, '-' for stdout; with several inputs a pattern such as '{stem}.srt' or 'out/{reldir}/{stem}.srt'.",
    ),
]
Format = Annotated[
    Optional[str],
    typer.Option(
        "-f",
        "--format",
        help="srt, vtt, json, jsonl, txt or html; or mkv, mp4, mov, webm: the video with the captions as a subtitle stream (default: from -o, else txt).",
    ),
]
Language = Annotated[
    Optional[str],
    typer.Option("--language", help="Language of the subtitle stream of an mkv/mp4/mov/webm output (default: und)."),
]
Partial = Annotated[
    bool,
    typer.Option("--partial", help="With -f jsonl on stdout: each cue's text so far, as generated, before the cue."),
]

# --- sampling ---------------------------------------------------------------------------------

Fps = Annotated[float, typer.Option("--fps", help="Frames sampled per second of video.")]
WindowSize = Annotated[int, typer.Option("--window", help="Consecutive samples captioned together as one cue.")]
WindowAs = Annotated[
    Optional[str],
    typer.Option(
        "--window-as",
        help="How a window reaches the model: video (one clip with its frame times) or images (separate pictures); default: video where the model supports it.",
    ),
]
MinPixels = Annotated[
    Optional[int],
    typer.Option(
        "--min-pixels",
        help="Fewest pixels a still is resized to, for models sized by a pixel budget (Qwen3-VL; default: the model's).",
    ),
]
MaxPixels = Annotated[
    Optional[int],
    typer.Option(
        "--max-pixels",
        help="Most pixels a still is resized to, for models sized by a pixel budget (default: the model's).",
    ),
]
FrameMinPixels = Annotated[
    Optional[int],
    typer.Option(
        "--frame-min-pixels",
        help="Fewest pixels each frame of a window is resized to (pixel-budget models; default: the model's).",
    ),
]
FrameMaxPixels = Annotated[
    Optional[int],
    typer.Option(
        "--frame-max-pixels",
        help="Most pixels each frame of a window is resized to (pixel-budget models; default: the model's).",
    ),
]
Start = Annotated[float, typer.Option("-ss", help="Start at this many seconds.")]
Duration = Annotated[Optional[float], typer.Option("-t", help="Caption this many seconds.")]
MaxFrames = Annotated[Optional[int], typer.Option("--max-frames", help="Stop after this many samples.")]

# --- the model and how it answers -------------------------------------------------------------

Engine = Annotated[Optional[str], typer.Option("--engine", help="Engine name (see `ffai engines`).")]
Model = Annotated[Optional[str], typer.Option("--model", help="Model name or checkpoint folder.")]
Prompt = Annotated[Optional[str], typer.Option("--prompt", help="Question to ask instead of a caption.")]
MaxNewTokens = Annotated[int, typer.Option("--max-new-tokens", help="Longest answer, in tokens.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed; required for sampling.")]
Temperature = Annotated[float, typer.Option("--temperature", help="Sampling temperature (0: greedy).")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")]
TopK = Annotated[int, typer.Option("--top-k", help="Sample among the k most likely tokens (0: all).")]
Stop = Annotated[
    Optional[List[str]],
    typer.Option(
        "--stop",
        metavar="STR",
        help="End an answer where its text first holds this string, the string left out (repeatable; "
        'e.g. --stop "." for one sentence).',
    ),
]
RepetitionPenalty = Annotated[
    float,
    typer.Option(
        "--repetition-penalty",
        help="Make tokens already in the prompt or the answer less likely, greedy or sampled (1.0: off; "
        "1.1-1.3 stops a small model's loops), as transformers' repetition_penalty.",
    ),
]

# --- where and how it runs --------------------------------------------------------------------

Dtype = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="float32 (exact), or opt-in bfloat16 or int8 (faster on CPUs built for them, rounding differs; see `ffai engines`).",
    ),
]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")]
Threads = Annotated[
    Optional[int],
    typer.Option("--threads", help="Torch threads per process running stages (default: the cores shared out)."),
]
Compile = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="With --dtype int8 or bfloat16: run the decode step compiled for this machine (once, a minute or two, cached; needs a C++ compiler).",
    ),
]
Placement = Annotated[
    str,
    typer.Option(
        "--placement",
        help="Where the model runs: auto, inline (this process) or workers (worker processes); auto: workers for video on more than 2 cores.",
    ),
]
MaxInFlight = Annotated[
    Optional[int],
    typer.Option("--max-in-flight", help="Windows in the pipeline at once (default: the batch and one more)."),
]
Batch = Annotated[
    str,
    typer.Option(
        "--batch",
        help="Windows the text stage decodes together, one token each per step: a number, or auto (4 on a CPU, 8 on a GPU, 1 with --compile); 1: one at a time. A window's tokens are the same either way.",
    ),
]

# --- live sources -----------------------------------------------------------------------------

MaxLag = Annotated[
    Optional[float],
    typer.Option(
        "--max-lag", help="Live sources: drop whole windows that fall this many seconds behind the source (default 10)."
    ),
]
NoDrop = Annotated[
    bool,
    typer.Option("--no-drop", help="Live sources: caption every window; decoding pauses while the model works."),
]
StallTimeout = Annotated[
    Optional[float],
    typer.Option("--stall-timeout", help="Live sources: no video for this many seconds is an error (default 10)."),
]

# --- Ray ----------------------------------------------------------------------------------------

Ray = Annotated[
    Optional[str],
    typer.Option(
        "--ray",
        metavar="[ADDRESS|local]",
        help="Caption on a Ray cluster: alone, $RAY_ADDRESS or the one `ray start --head` started here; 'local': a Ray of its own for this run; or the cluster's ADDRESS. Needs pip install 'ffai\\[ray]'.",
    ),
]
RayActors = Annotated[
    Optional[int], typer.Option("--ray-actors", help="Engine actors (default: one per CPU, or one per GPU).")
]
RayCpusPerActor = Annotated[
    Optional[float],
    typer.Option("--ray-cpus-per-actor", help="CPUs, and torch threads, per engine actor (default: 1)."),
]
RayGpusPerActor = Annotated[
    Optional[float],
    typer.Option("--ray-gpus-per-actor", help="GPUs per engine actor (default: 1 if the cluster has GPUs, else 0)."),
]

# --- the run ------------------------------------------------------------------------------------

Resume = Annotated[
    bool, typer.Option("--resume", help="Skip inputs the run record says are done; redo unfinished ones.")
]
RunLog = Annotated[
    Optional[str],
    typer.Option("--run-log", help="Run record (JSON Lines; default: ffai-run.jsonl beside the outputs)."),
]
Retries = Annotated[int, typer.Option("--retries", help="Tries again an input whose worker died, this many times.")]
Progress = Annotated[
    Optional[bool],
    typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal)."),
]


def caption(
    inputs: Inputs,
    output: Output = None,
    fmt: Format = None,
    language: Language = None,
    partial: Partial = False,
    fps: Fps = 1.0,
    window: WindowSize = 8,
    window_as: WindowAs = None,
    min_pixels: MinPixels = None,
    max_pixels: MaxPixels = None,
    frame_min_pixels: FrameMinPixels = None,
    frame_max_pixels: FrameMaxPixels = None,
    start: Start = 0.0,
    duration: Duration = None,
    max_frames: MaxFrames = None,
    engine: Engine = None,
    model: Model = None,
    prompt: Prompt = None,
    max_new_tokens: MaxNewTokens = 64,
    seed: Seed = None,
    temperature: Temperature = 0.0,
    top_p: TopP = 1.0,
    top_k: TopK = 0,
    repetition_penalty: RepetitionPenalty = 1.0,
    stop: Stop = None,
    dtype: Dtype = "float32",
    device: Device = "auto",
    threads: Threads = None,
    compile_: Compile = False,
    placement: Placement = "auto",
    max_in_flight: MaxInFlight = None,
    batch: Batch = "auto",
    max_lag: MaxLag = None,
    no_drop: NoDrop = False,
    stall_timeout: StallTimeout = None,
    ray: Ray = None,
    ray_actors: RayActors = None,
    ray_cpus_per_actor: RayCpusPerActor = None,
    ray_gpus_per_actor: RayGpusPerActor = None,
    overwrite: Overwrite = False,
    never_overwrite: NeverOverwrite = False,
    resume: Resume = False,
    run_log: RunLog = None,
    retries: Retries = 2,
    progress: Progress = None,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Caption images and videos; write timed caption tracks."""
    from ffai.run import jobs

    settle(verbose, quiet, overwrite, never_overwrite)
    options = caption_options(
        engine=engine,
        model=model,
        fps=fps,
        window=window,
        start=start,
        duration=duration,
        max_frames=max_frames,
        prompt=prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        repetition_penalty=repetition_penalty,
        stop=tuple(stop or ()),
        seed=seed,
        window_as=window_as,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        frame_min_pixels=frame_min_pixels,
        frame_max_pixels=frame_max_pixels,
        dtype=dtype,
        device=device,
        threads=threads,
        compile_=compile_,
        max_in_flight=max_in_flight,
        batch=batch,
        placement=placement,
        max_lag=max_lag,
        no_drop=no_drop,
        stall_timeout=stall_timeout,
    )
    make_backend = ray_backend(ray, ray_actors, ray_cpus_per_actor, ray_gpus_per_actor, partial=partial)
    failed = jobs.run_caption_jobs(
        inputs,
        output,
        fmt,
        options,
        overwrite=overwrite,
        progress=shows_progress(progress),
        resume=resume,
        run_log=run_log,
        retries=retries,
        make_backend=make_backend,
        partial=partial,
        language=language,
    )
    if failed:
        raise typer.Exit(1)


def caption_options(
    *,
    engine: str | None,
    model: str | None,
    fps: float,
    window: int,
    start: float,
    duration: float | None,
    max_frames: int | None,
    prompt: str | None,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    repetition_penalty: float,
    stop: tuple[str, ...],
    seed: int | None,
    window_as: str | None,
    min_pixels: int | None,
    max_pixels: int | None,
    frame_min_pixels: int | None,
    frame_max_pixels: int | None,
    dtype: str,
    device: str,
    threads: int | None,
    compile_: bool,
    max_in_flight: int | None,
    batch: str,
    placement: str,
    max_lag: float | None,
    no_drop: bool,
    stall_timeout: float | None,
) -> CaptionOptions:
    """The run's options from its flags: what is sampled, what the engine is asked and how it
    decodes, where it runs, and how a live source keeps up. Each part checks its own values."""
    from ffai.engines.contract import DecodingOptions, RuntimeOptions
    from ffai.run.options import CaptionOptions, parse_batch

    return CaptionOptions(
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
            repetition_penalty=repetition_penalty,
            stop=stop,
            seed=seed,
            window_as=window_as,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            frame_min_pixels=frame_min_pixels,
            frame_max_pixels=frame_max_pixels,
        ),
        runtime=RuntimeOptions(
            dtype=dtype,
            device=device,
            threads=threads,
            compile=compile_,
            batch=parse_batch(batch, device, compile_),
        ),
        max_in_flight=max_in_flight,
        placement=placement,
        **live_options(max_lag, no_drop, stall_timeout),
    )


def live_options(max_lag: float | None, no_drop: bool, stall_timeout: float | None) -> dict:
    """CaptionOptions' live-source fields from their flags; left out, the defaults hold."""
    if no_drop and max_lag is not None:
        raise UsageError("--max-lag and --no-drop contradict each other")
    chosen = {"max_lag": None} if no_drop else {} if max_lag is None else {"max_lag": max_lag}
    return chosen if stall_timeout is None else {**chosen, "stall_timeout": stall_timeout}


def ray_backend(
    address: str | None,
    actors: int | None,
    cpus_per_actor: float | None,
    gpus_per_actor: float | None,
    *,
    partial: bool,
) -> Callable | None:
    """How the run makes its Ray backend (``--ray ADDRESS``), or None to caption on this machine.
    Checks, before any work, that the Ray flags go together and that Ray is installed."""
    resource_flags = (actors, cpus_per_actor, gpus_per_actor)
    if address is None:
        if any(flag is not None for flag in resource_flags):
            raise UsageError("--ray-actors, --ray-cpus-per-actor and --ray-gpus-per-actor need --ray")
        return None
    from ffai.ray.backend import RayBackend, RayResources, import_ray

    if partial:
        raise UsageError("--partial is not available with --ray: answers come back from the cluster whole")
    import_ray()  # without the extra, say so before any work
    return functools.partial(RayBackend, address=address, resources=RayResources(*resource_flags))


def shows_progress(progress: bool | None) -> bool:
    """Whether the run draws its progress bar: as asked, else when stderr is a terminal; never with -q."""
    return (sys.stderr.isatty() if progress is None else progress) and not State.quiet
