"""``ffai caption`` over several inputs: name each output, check every cheap thing first,
then caption each input into its own track. A failed input is reported and the others go on.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ffai import media
from ffai.captioning import Captioner, CaptionOptions, Progress
from ffai.errors import FfaiError, UsageError
from ffai.tracks import TrackHeader, check_output, open_track, resolve_format

PATTERN_FIELDS = ("{stem}", "{name}", "{parent}")


@dataclass
class Job:
    source: str
    output: str | None  # None or "-": stdout
    fmt: str


def plan_jobs(inputs: Sequence[str], output: str | None, fmt: str | None) -> list[Job]:
    """One job per input; outputs named from ``-o`` (a pattern when several inputs)."""
    if len(set(inputs)) != len(inputs):
        raise UsageError("the same input is given twice")
    is_pattern = output is not None and any(f in output for f in PATTERN_FIELDS)
    several = len(inputs) > 1
    if several and output not in (None, "-") and not is_pattern:
        raise UsageError("several inputs need -o with a pattern such as '{stem}.srt' (or -o - for stdout)")
    jobs = []
    for source in inputs:
        target = output
        if is_pattern:
            p = Path(source)
            target = output.format(stem=p.stem, name=p.name, parent=str(p.parent))
        elif output is None and fmt is not None and several:
            target = str(Path(source).with_suffix("." + fmt))
        jobs.append(Job(source, target, resolve_format(target, fmt)))
    targets = [j.output for j in jobs if j.output not in (None, "-")]
    if len(set(targets)) != len(targets):
        raise UsageError("two inputs would write the same output; use {name} or {parent} in the -o pattern")
    return jobs


def run_caption_jobs(
    inputs: Sequence[str],
    output: str | None,
    fmt: str | None,
    options: CaptionOptions,
    *,
    overwrite: bool,
    progress: bool,
    warn: Callable[[str], None],
    error: Callable[[str], None],
) -> int:
    """Caption every input; return how many failed. Raises only for errors that stop the
    whole run (bad flags, an unknown engine or model, a pipeline that cannot start) — before
    any input is decoded."""
    jobs = plan_jobs(inputs, output, fmt)
    for job in jobs:
        check_output(job.output, overwrite)
    failed = 0

    def fail(e: FfaiError) -> None:
        nonlocal failed
        if len(jobs) == 1:
            raise e
        failed += 1
        error(str(e))

    probed = []
    decoder = media.Decoder()  # each input probed in a child process: a decoder crash fails that input alone
    for job in jobs:
        try:
            probed.append((job, decoder.probe(job.source)))
        except FfaiError as e:
            fail(e)
    if not probed:
        return failed
    with Captioner(options, video=any(info.kind == "video" for _, info in probed)) as captioner:
        for notice in captioner.notices:
            warn(notice)
        for job, info in probed:
            try:
                _run_one(captioner, job, info, options, overwrite=overwrite, progress=progress, warn=warn)
            except FfaiError as e:
                fail(e)
    return failed


def _run_one(
    captioner: Captioner,
    job: Job,
    info: media.MediaInfo,
    options: CaptionOptions,
    *,
    overwrite: bool,
    progress: bool,
    warn,
) -> None:
    d = options.decoding
    header = TrackHeader(
        source_path=str(info.path),
        duration=info.duration,
        width=info.width,
        height=info.height,
        engine=captioner.engine.info.name,
        model=captioner.model_name,
        fps=options.fps if info.kind == "video" else None,
        window=options.window if info.kind == "video" else None,
        prompt=d.prompt,
        max_new_tokens=d.max_new_tokens,
        seed=d.seed,
    )
    writer = open_track(job.output, job.fmt, header, overwrite=overwrite)
    cues = 0
    try:
        with _progress_bar(progress, info, options) as hooks:
            for cue in captioner.captions(info, hooks):
                writer.write(cue)
                cues += 1
    except BaseException:
        writer.abort()
        raise
    writer.close()
    if cues == 0:
        warn(f"{job.source}: no frames decoded; the track is empty")


def _progress_bar(enabled: bool, info: media.MediaInfo, options: CaptionOptions):
    if not enabled or info.kind != "video":
        return nullcontext(Progress())
    from ffai.progress import CaptionProgress

    return CaptionProgress(info, options)
