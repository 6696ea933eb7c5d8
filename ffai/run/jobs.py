"""``ffai caption`` over one input or a corpus: expand the inputs, name each output, check every
cheap thing first, then hand the inputs to a backend and be the one writer of their outputs
and of the run record.

A backend (``ffai.run.input_events.Backend``: ``LocalBackend`` here, on this machine, or
``ffai.ray.backend``'s on a cluster) turns inputs into events; this module opens, writes,
finishes or aborts every output, retries inputs whose worker died (``--retries``), skips what
an earlier run finished (``--resume``) and reports a failed input without stopping the others.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from ffai import messages
from ffai.errors import FfaiError, OutputError, UsageError
from ffai.media import MediaInfo, is_live, source_label
from ffai.outputs import mux
from ffai.outputs.cues import TrackHeader, creation_time
from ffai.outputs.tracks import (
    TrackWriter,
    check_not_an_input,
    check_output,
    check_partial,
    may_show_answers,
    wants_thumbnails,
)
from ffai.pipeline import WorkerDied
from ffai.run import inputs as input_specs
from ffai.run import interrupts, runlog
from ffai.run.captioner import Captioner, Progress, ResolvedModel, resolve_model
from ffai.run.input_events import Backend, InputEvent
from ffai.run.options import CaptionOptions

PATTERN_FIELDS = ("{stem}", "{name}", "{parent}", "{reldir}")
MIRROR_FIELD = "{reldir}"
DEFAULT_RETRIES = 2


@dataclass
class Job:
    source: str
    output: str | None  # None or "-": stdout
    fmt: str
    # The output may be replaced: -y, or a file this run (or an unfinished earlier run) wrote.
    overwrite: bool = False

    @property
    def to_file(self) -> bool:
        return self.output not in (None, "-")


def plan_jobs(inputs: Sequence[input_specs.Input], output: str | None, fmt: str | None) -> list[Job]:
    """One job per input; outputs named from ``-o`` (a pattern when several inputs)."""
    is_pattern = output is not None and any(f in output for f in PATTERN_FIELDS)
    several = len(inputs) > 1
    if several and output not in (None, "-") and not is_pattern:
        raise UsageError("several inputs need -o with a pattern such as '{stem}.srt' (or -o - for stdout)")
    jobs = []
    for item in inputs:
        target = output
        if is_pattern:
            target = _fill(output, item)
        elif output is None and fmt is not None and several:
            target = os.path.splitext(item.source)[0] + "." + fmt
        jobs.append(Job(item.source, target, mux.resolve_format(target, fmt)))
    writers: dict[str, str] = {}
    for job in jobs:
        if not job.to_file:
            continue
        other = writers.setdefault(os.path.abspath(job.output), job.source)
        if other != job.source:
            raise UsageError(
                f"{other} and {job.source} would both write {job.output}; "
                "use {reldir}, {name} or {parent} in the -o pattern"
            )
    return jobs


def _fill(pattern: str, item: input_specs.Input) -> str:
    p = os.path.normpath(item.path) if item.path else item.source  # a file:// URL's file, not the URL
    stem, _ = os.path.splitext(os.path.basename(p))
    try:
        filled = pattern.format(
            stem=stem, name=os.path.basename(p), parent=os.path.dirname(p) or ".", reldir=input_specs.reldir(item)
        )
    except (KeyError, IndexError, ValueError) as e:
        fields = ", ".join(PATTERN_FIELDS)
        raise UsageError(f"-o {pattern!r}: not a pattern ffai can fill ({fields}): {e}") from None
    return os.path.normpath(filled)


@dataclass
class RunSummary:
    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (input, one-line reason)

    def lines(self) -> list[str]:
        counts = f"{self.done} done, {self.skipped} skipped, {len(self.failed)} failed"
        return [counts] + [f"failed: {reason}" for _, reason in self.failed]


def run_caption_jobs(
    inputs: Sequence[str],
    output: str | None,
    fmt: str | None,
    options: CaptionOptions,
    *,
    overwrite: bool,
    progress: bool,
    resume: bool = False,
    run_log: str | None = None,
    retries: int = DEFAULT_RETRIES,
    make_backend: Callable[[CaptionOptions], Backend] | None = None,
    partial: bool = False,
    language: str | None = None,
) -> int:
    """Caption every input; return how many failed. Raises only for errors that stop the
    whole run (bad flags, an unknown engine or model, outputs that may not be written, a
    pipeline that cannot start) — before any input is decoded. What it has to say goes to
    ``ffai.messages``: a failed input of several as an error, the summary of several inputs as
    notes at the end. ``make_backend(options)`` gives where the inputs are
    captioned (default: ``LocalBackend``, this machine; ``--ray``: ``ffai.ray.backend``).
    ``language`` tags the subtitle stream of container outputs (``ffai.outputs.mux``)."""
    if retries < 0:
        raise UsageError("--retries must be 0 or more")
    items = input_specs.expand(inputs)
    jobs = plan_jobs(items, output, fmt)
    # Before anything is read: an output that is an input is refused (alone, among several inputs).
    refused = _outputs_that_are_inputs(jobs, {item.source: item.path for item in items if item.path})
    if len(jobs) == 1 and refused:
        raise refused[0]
    _check_containers([job for i, job in enumerate(jobs) if i not in refused], language, local=make_backend is None)
    # A track that shows the frames (html) needs thumbnails, made where the frames are.
    options = dataclasses.replace(options, thumbnails=any(wants_thumbnails(job.fmt) for job in jobs))
    for job in jobs if partial else ():
        check_partial(job.output, job.fmt)
    # A track that shows answers as they are generated (txt on stdout, --partial) streams them.
    stream = any(may_show_answers(job.output, job.fmt, partial) for job in jobs)
    options = dataclasses.replace(options, stream_answers=stream)
    model = resolve_model(options)
    record_path = _record_path(jobs, output, run_log, resume)
    log = None
    skip: set[int] = set()
    if record_path is not None:
        fmts = sorted({job.fmt for job in jobs})
        log = runlog.RunLog(record_path, runlog.settings(options, model, fmts[0] if len(fmts) == 1 else fmts))
    if resume:
        skip = _resume(jobs, runlog.read(record_path), log, overwrite) - set(refused)
    else:
        for job in jobs:
            job.overwrite = overwrite
    for i, job in enumerate(jobs):
        if i in refused:
            continue
        if job.to_file and output is not None and MIRROR_FIELD in output:
            _make_folder(job.output)
        if not (job.overwrite or i in skip):
            check_output(job.output, False)
    driver = _Driver(jobs, options, model, log, retries=retries, partial=partial, language=language)
    # Made from the options as settled here (thumbnails, streamed answers); by default this machine.
    if make_backend is None:
        backend = LocalBackend(options, on_text=driver.show)
    else:
        backend = make_backend(options)
    with log if log is not None else nullcontext(), backend as active:
        with _progress(progress, len(jobs), options) as bar:
            driver.progress = bar
            driver.run(active, skip, refused)
    if len(jobs) > 1:
        for line in driver.summary.lines():
            messages.note(line)
    return len(driver.summary.failed)


def _outputs_that_are_inputs(jobs: list[Job], paths: dict[str, str]) -> dict[int, OutputError]:
    """The jobs whose output is the file of their input or of another input of the run, each with
    its one-line refusal."""
    refused = {}
    for i, job in enumerate(jobs):
        if job.to_file:
            try:
                check_not_an_input(job.output, job.source, paths)
            except OutputError as e:
                refused[i] = e
    return refused


def _check_containers(jobs: list[Job], language: str | None, *, local: bool) -> None:
    """Container outputs (``ffai.outputs.mux``): what can be told before the model loads. A single
    input's file is also opened (headers only), so a still or a codec the container cannot hold
    is refused now; a corpus's inputs are checked as each is opened, failing alone."""
    containers = [job for job in jobs if mux.is_container(job.fmt)]
    if language is not None and not containers:
        raise UsageError("--language tags the subtitle stream of -o .mkv, .mp4, .mov or .webm outputs")
    mux.check_language(language)
    for job in containers:
        mux.check_job(job.source, job.output, job.fmt)
        if is_live(job.source) and not local:
            raise UsageError(f"{job.source}: a live source is copied into -o .{job.fmt} by a local run, not --ray")
    if len(jobs) == 1 and containers and os.path.isfile(jobs[0].source):
        mux.check_source(jobs[0].source, jobs[0].output, jobs[0].fmt)


def _record_path(jobs: list[Job], output: str | None, run_log: str | None, resume: bool) -> str | None:
    """Where the run record goes: ``--run-log``, else beside the outputs when the run has
    several inputs or resumes (``ffai-run.jsonl`` in the folder the -o pattern starts in)."""
    if not all(job.to_file for job in jobs):
        if resume:
            raise UsageError("--resume needs outputs in files (-o with a pattern such as '{stem}.srt')")
        return run_log
    if run_log is not None:
        return run_log
    if len(jobs) == 1 and not resume:
        return None
    fixed = (output or "").split("{", 1)[0]
    return os.path.join(os.path.dirname(fixed), runlog.DEFAULT_NAME)


def _resume(
    jobs: list[Job], previous: dict[tuple[str, str], runlog.Previous], log: runlog.RunLog, overwrite: bool
) -> set[int]:
    """Which jobs an earlier run finished with the same fingerprint (skipped), and which outputs
    it left unfinished (replaced without -y). An output finished under other settings, or
    from an input that changed since, is replaced with -y and refused without."""
    skip = set()
    for i, job in enumerate(jobs):
        job.overwrite = overwrite
        before = previous.get(runlog.key(job.source, job.output))
        if before is None:
            continue
        exists = os.path.lexists(job.output)
        if before.status not in ("done", "skipped"):
            job.overwrite = True  # half-written or failed: ours to redo
            continue
        if not exists:
            continue
        changed = _changes(before, job, log)
        if not changed:
            skip.add(i)
        elif not overwrite:
            raise OutputError(
                f"{job.output}: written with other settings ({', '.join(changed)} changed); "
                "use -y to redo it, or another -o"
            )
    return skip


def _changes(before: runlog.Previous, job: Job, log: runlog.RunLog) -> list[str]:
    changed = []
    if before.fingerprint != log.fingerprint:
        changed += runlog.changed_settings(before.settings, log.settings)
    if (before.size, before.mtime) != runlog.file_identity(job.source):
        changed.append("the input file")
    return changed


def _make_folder(output: str) -> None:
    folder = os.path.dirname(os.path.abspath(output))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{output}: cannot create {folder} ({e.strerror or e})") from e


def _progress(enabled: bool, total: int, options: CaptionOptions):
    if not enabled:
        return nullcontext(None)
    from ffai.run.progress import RunProgress

    return RunProgress(total, options)


TERMINAL = ("done", "failed")


class _Driver:
    """Writes the events of one run: outputs, run record, progress, retries, summary."""

    def __init__(
        self,
        jobs: list[Job],
        options: CaptionOptions,
        model: ResolvedModel,
        log: runlog.RunLog | None,
        *,
        retries: int,
        partial: bool = False,
        language: str | None = None,
    ) -> None:
        self.jobs = jobs
        self.partial = partial
        self.language = language
        self.options = options
        self.model = model
        self.log = log
        self.retries = retries
        self.progress = None
        self.summary = RunSummary()
        self.attempts: dict[int, int] = defaultdict(int)
        self.writers: dict[int, TrackWriter] = {}
        self.cues: dict[int, int] = defaultdict(int)
        self.broken: dict[int, FfaiError] = {}  # jobs whose output failed in this process
        self.tees: dict[int, mux.LiveTee] = {}  # live sources copied into containers, by job

    def run(self, backend: Backend, skip: set[int], refused: dict[int, FfaiError] | None = None) -> None:
        """Caption every job but those in ``skip`` (done by an earlier run) and ``refused`` (failed
        before they start, with their reason)."""
        refused = refused or {}
        for i in sorted(skip):
            self.summary.skipped += 1
            self._record(i, "skipped")
            self._progress("finished")
        for i, error in sorted(refused.items()):
            self._record(i, "failed", attempts=0, error=str(error), transient=False, retry=False)
            messages.error(str(error))
            self.summary.failed.append((self.jobs[i].source, str(error)))
            self._progress("finished", failed=True)
        pending = [i for i in range(len(self.jobs)) if i not in skip and i not in refused]
        try:
            while pending:
                for i in pending:
                    self.attempts[i] += 1
                events = backend.run([(i, self._reads(i)) for i in pending])
                if not all(self.jobs[i].to_file for i in pending):
                    events = _in_job_order(events, pending)
                retry = []
                for event in events:
                    interrupts.check()
                    if self._handle(event):
                        retry.append(event.job)
                pending = sorted(retry)
        except BaseException as e:
            self._stop_all(e)
            raise
        finally:
            for tee in self.tees.values():
                tee.close()

    def _reads(self, i: int) -> str:
        """What the backend reads for job ``i``: its source, or for a live source copied into a
        container, the pipe its tee passes the video on through (``ffai.outputs.mux.LiveTee``)."""
        job = self.jobs[i]
        if mux.is_container(job.fmt) and is_live(job.source):
            if i not in self.tees:  # read once: a retry finds the same tee
                self.tees[i] = mux.LiveTee(job.source, job.output, job.fmt)
            return self.tees[i].path
        return job.source

    def _handle(self, event: InputEvent) -> bool:
        """Act on one event; True when the input is to be tried again."""
        i = event.job
        if event.kind == "start":
            self._start(i, event.info)
        elif event.kind == "cue":
            self._cue(i, event)
        elif event.kind == "done":
            return self._end(i, event, None)
        elif event.kind == "failed":
            return self._end(i, event, event.error or "failed")
        return False

    def _start(self, i: int, info: MediaInfo) -> None:
        job = self.jobs[i]
        self.cues[i] = 0
        self.broken.pop(i, None)
        self._record(i, "running", attempts=self.attempts[i])
        self._progress("started", info)
        try:
            header = self._header(info)
            self.writers[i] = mux.open_output(
                job.output,
                job.fmt,
                header,
                overwrite=job.overwrite,
                partial=self.partial,
                start=self.options.start,
                duration=self.options.duration,
                language=self.language,
                tee=self.tees.get(i),
            )
        except FfaiError as e:
            self.broken[i] = e

    def _cue(self, i: int, event: InputEvent) -> None:
        writer = self.writers.get(i)
        if writer is None:  # its output failed: the rest of its cues have nowhere to go
            return
        try:
            with interrupts.deferred():  # Ctrl-C between the two would leave the record a cue short
                writer.write(event.cue)
                self.cues[i] += 1
        except FfaiError as e:
            self._abort(i)
            self.broken[i] = e
            return
        self.jobs[i].overwrite = True  # the file is now this run's: a retry replaces it
        self._progress("cue", event.cue)

    def show(self, i: int, index: int, piece: str) -> None:
        """A piece of input ``i``'s cue ``index`` as its answer is generated (``TrackWriter.show``);
        called by the local backend while it captions, between the input's events."""
        writer = self.writers.get(i)
        if writer is None:
            return
        try:
            writer.show(index, piece)
        except FfaiError as e:
            self._abort(i)
            self.broken[i] = e

    def _end(self, i: int, event: InputEvent, reason: str | None) -> bool:
        job = self.jobs[i]
        broken = self.broken.pop(i, None)
        if reason is None and broken is None:
            try:
                self.writers.pop(i).close()
            except FfaiError as e:
                broken = e
            else:
                if self.cues[i] == 0:
                    messages.warn(f"{job.source}: no frames decoded; the track is empty")
                self.summary.done += 1
                self._record(i, "done", attempts=self.attempts[i], seconds=event.seconds, cues=self.cues[i])
                self._progress("finished")
                return False
        self._abort(i)
        if broken is not None:
            reason, transient = str(broken), False
        else:
            transient = event.transient
        # a live source a tee read is gone once read: its output keeps what it got
        retry = transient and self.attempts[i] <= self.retries and i not in self.tees
        tee = self.tees.get(i)
        if tee is not None:  # the decoder read the tee's pipe: name the source, or why the tee failed
            reason = str(tee.error) if tee.error is not None else reason.replace(tee.path, source_label(job.source))
        reason = reason if job.source in reason else f"{job.source}: {reason}"
        self._record(
            i,
            "failed",
            attempts=self.attempts[i],
            seconds=event.seconds,
            cues=self.cues[i],
            error=reason,
            transient=transient,
            retry=retry,
        )
        if retry:
            messages.warn(f"{reason}; trying again ({self.attempts[i]} of {self.retries + 1} attempts made)")
            return True
        if len(self.jobs) == 1:
            raise broken if broken is not None else FfaiError(reason)
        messages.error(reason)
        self.summary.failed.append((job.source, reason))
        self._progress("finished", failed=True)
        return False

    def _abort(self, i: int) -> None:
        writer = self.writers.pop(i, None)
        if writer is not None:
            writer.abort()  # finished cues stay, in a valid file

    def _stop_all(self, exc: BaseException) -> None:
        """The run stops (Ctrl-C, or an error that ends it): every open output keeps its
        finished cues, and the record says which inputs were left unfinished."""
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        for i in list(self.writers):
            try:
                self._abort(i)
            finally:
                extra = {} if status == "interrupted" else {"error": " ".join(str(exc).split())}
                self._record(i, status, attempts=self.attempts[i], cues=self.cues[i], **extra)

    def _header(self, info: MediaInfo) -> TrackHeader:
        o, d = self.options, self.options.decoding
        video = info.kind == "video"
        return TrackHeader(
            source_path=str(info.path),
            duration=info.duration,
            width=info.width,
            height=info.height,
            engine=self.model.engine.info.name,
            model=self.model.name,
            fps=o.fps if video else None,
            window=o.window if video else None,
            prompt=d.prompt,
            max_new_tokens=d.max_new_tokens,
            seed=d.seed,
            temperature=d.temperature,
            top_p=d.top_p,
            top_k=d.top_k,
            repetition_penalty=d.repetition_penalty if d.repetition_penalty != 1.0 else None,
            stop=d.stop,
            created=creation_time(),
        )

    def _record(self, i: int, status: str, **fields) -> None:
        if self.log is not None:
            job = self.jobs[i]
            self.log.input(job.source, job.output, status, **fields)

    def _progress(self, what: str, *args, **kwargs) -> None:
        if self.progress is not None:
            getattr(self.progress, what)(*args, **kwargs)


def _in_job_order(events: Iterable[InputEvent], jobs: list[int]) -> Iterator[InputEvent]:
    """The events of a stream output (stdout) one input after another, in job order, holding
    back those of inputs a backend runs side by side, so two tracks never interleave."""
    held: dict[int, list[InputEvent]] = defaultdict(list)
    ended: set[int] = set()
    at = 0
    for event in events:
        held[event.job].append(event)
        if event.kind in TERMINAL:
            ended.add(event.job)
        while at < len(jobs):
            yield from held.pop(jobs[at], [])
            if jobs[at] not in ended:
                break
            at += 1
    for job in jobs[at:]:
        yield from held.pop(job, [])


class LocalBackend:
    """Inputs captioned on this machine, one after another, by one ``Captioner`` (its stages
    inline or in worker processes, ``--placement``). Each input is probed just before it is
    captioned, in a decoder child process of its own. A worker process that dies fails the
    input it was working on as transient and the next input starts a fresh pipeline."""

    def __init__(self, options: CaptionOptions, on_text: Callable[[int, int, str], None] | None = None) -> None:
        self._captioner = Captioner(options)  # the cheap checks; nothing starts here
        # (job, cue index, piece) as answers are generated, with options.stream_answers
        self._on_text = on_text

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self._captioner.close()

    def run(self, inputs: Sequence[tuple[int, str]]) -> Iterator[InputEvent]:
        captioner = self._captioner
        for job, source in inputs:
            began = time.monotonic()
            if is_live(source):  # a stream waits for no one: load the model before opening it
                captioner.start(video=True)
            try:
                info = captioner.decoder.probe(source)
            except FfaiError as e:
                yield InputEvent(job, "failed", error=str(e), seconds=time.monotonic() - began)
                continue
            yield InputEvent(job, "start", info=info)
            # The placement follows the first input probed: it is planned when the pipeline
            # starts, and the rest of a corpus is not probed ahead of its turn.
            captioner.start(video=info.kind == "video")
            try:
                shown = Progress(on_text=functools.partial(self._on_text, job)) if self._on_text else None
                for cue in captioner.captions(info, shown):
                    yield InputEvent(job, "cue", cue=cue)
            except WorkerDied as e:
                captioner.close()
                yield InputEvent(job, "failed", error=str(e), transient=True, seconds=time.monotonic() - began)
                continue
            except FfaiError as e:
                yield InputEvent(job, "failed", error=str(e), seconds=time.monotonic() - began)
                continue
            yield InputEvent(job, "done", seconds=time.monotonic() - began)
