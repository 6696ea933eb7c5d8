"""The caption job as a library: ``caption(inputs, options)`` yields cues.

This module owns the order of work: cheap checks first (options, inputs, engine, model
folder, window size against the context), then the pipeline, whose stages load the weights.
It also decides where the stages run (``placement``). It knows the engine only through the
contract in ``ffai.engines.contract``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterable, Iterator, Sequence

from ffai import media, messages, models
from ffai.engines import registry
from ffai.engines.contract import Answer, Engine, Request, RuntimeOptions, StageSpec
from ffai.kit import host
from ffai.outputs.cues import Cue, Dropped
from ffai.pipeline import Coordinator, PipelineConfig, PipelineError, ProcessConfig, StageConfig
from ffai.run import live, window_source
from ffai.run.options import CaptionOptions
from ffai.run.streaming import StrippedPieces
from ffai.run.window_source import InOrder, answered_cue
from ffai.run.windows import Window

COMPILE_START_TIMEOUT_S = 900.0  # how long a worker may take to report ready where its load may compile


@dataclass
class Progress:
    """Callbacks a front end may set to follow a run; all optional."""

    on_frame: Callable[[float], None] | None = None
    on_cue: Callable[[Cue], None] | None = None
    # (cue index, piece) as each answer is generated, with CaptionOptions.stream_answers: the
    # pieces of a cue add up to its text, and come before the cue.
    on_text: Callable[[int, str], None] | None = None


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# At or below this many cores every stage shares one process and the stages take turns, each
# with all the cores: vision is most of the work, so two 1-thread processes side by side leave
# the text process idle much of the time, while one process holds one torch runtime and one set
# of weights instead of two (docs/how-it-works.md, docs/benchmarks.md).
SHARED_PROCESS_MAX_CORES = 2
SHARED_PROCESS = "engine"


def placement(choice: str, *, cores: int, video: bool) -> str:
    """Where a run's stages go: ``"inline"`` (threads of this process) or ``"workers"`` (spawned
    worker processes). ``"auto"`` gives workers only to a run with video on more than
    ``SHARED_PROCESS_MAX_CORES`` cores, where decoding the next window overlaps the stages; a
    run of stills has nothing to overlap, and on fewer cores one process is all the stages get."""
    if choice != "auto":
        return choice
    return "workers" if video and cores > SHARED_PROCESS_MAX_CORES else "inline"


def pipeline_config(
    stages: Sequence[StageSpec], model_dir: Path, runtime: RuntimeOptions, cores: int, *, stream: bool = False
) -> PipelineConfig:
    """The engine's stages as a linear pipeline. On many cores each of the engine's processes
    gets its share of them, so that stages running side by side do not oversubscribe the
    machine; on ``SHARED_PROCESS_MAX_CORES`` or fewer all stages share one process and take
    turns, each with all the threads. With ``stream`` the last stage streams its answers' text
    as chunks (``ffai.run.streaming``)."""
    shared = cores <= SHARED_PROCESS_MAX_CORES
    processes = [SHARED_PROCESS] if shared else list(dict.fromkeys(spec.process for spec in stages))
    threads = runtime.threads or max(1, cores // len(processes))
    configs = []
    for i, spec in enumerate(stages):
        last = i == len(stages) - 1
        factory, args = spec.factory, (str(model_dir), runtime)
        if last and stream:
            factory, args = "ffai.run.streaming:answer_stage", (factory, *args)
        configs.append(
            StageConfig(
                name=spec.name,
                factory=factory,
                args=args,
                next=() if last else (stages[i + 1].name,),
                terminal=last,
                process=SHARED_PROCESS if shared else spec.process,
            )
        )
    placed = tuple(ProcessConfig(p, threads=threads, serial=shared) for p in processes)
    return PipelineConfig(stages=tuple(configs), processes=placed)


@dataclass(frozen=True)
class ResolvedModel:
    """The engine and model folder a run uses; resolving them loads no weights."""

    engine: Engine
    name: str  # as given, or the default model's name
    folder: Path
    warnings: tuple[str, ...]  # for the user, said by the Captioner that runs it (a fallback model, a slow dtype)


def resolve_model(options: CaptionOptions) -> ResolvedModel:
    """Which engine and model folder ``options`` name (a cheap check: nothing loads)."""
    engine = registry.engine_for_model(options.engine, options.model)
    warnings = []
    if options.model:
        name = options.model
    else:
        name, fallback = models.default_model(engine.info.name, engine.info.default_model)
        warnings += [fallback] if fallback else []
    if options.runtime.device != "cuda":
        slow = host.cpu_info().slow_dtype_warning(options.runtime.dtype)
        warnings += [slow] if slow else []
    return ResolvedModel(engine, name, models.resolve(name), tuple(warnings))


class Captioner:
    """A resolved engine and model folder, and the pipeline that runs it.

    Building one checks the cheap things (engine, model folder, window size against the
    context), plans the pipeline (``config``: stages, processes, threads) and warns about the
    model resolved (``ffai.messages``: a fallback model, a slow dtype). ``start()`` (or
    entering the ``with`` block) starts it, and its stages load the weights; ``close()`` (or
    leaving the block) stops it. One captioner serves every input of a run. Its stages run
    where ``placement(options.placement, ...)`` says: ``video=False`` tells it the run holds
    stills only; ``cores`` (default: those this process may run on) is what placement and
    thread counts are planned for.
    """

    def __init__(self, options: CaptionOptions, *, video: bool = True, cores: int | None = None) -> None:
        self.options = options
        self.cores = cores or available_cores()
        self.placement = placement(options.placement, cores=self.cores, video=video)
        resolved = resolve_model(options)
        self.engine: Engine = resolved.engine
        self.model_name = resolved.name
        self.model_dir: Path = resolved.folder
        self.engine.check_window(self.model_dir, options.window, options.decoding)
        self.config = pipeline_config(
            self.engine.stages(), self.model_dir, options.runtime, self.cores, stream=options.stream_answers
        )
        # Each input is read in a child process of its own: a decoder crash fails that input alone.
        self.decoder = media.Decoder(stall_timeout=options.stall_timeout)
        self._pipe: Coordinator | None = None
        for warning in resolved.warnings:  # the checks passed: before any weight loads
            messages.warn(warning)

    def start(self, *, video: bool | None = None) -> "Captioner":
        """Start the pipeline (its stages load the weights); a no-op while it runs. ``video``
        re-plans the placement for a run whose kind of input is known only now (a corpus
        whose first input was just probed)."""
        if self._pipe is None:
            if video is not None:
                self.placement = placement(self.options.placement, cores=self.cores, video=video)
            # A worker's first --compile load builds the engine's compiled parts: a minute or more
            # on a few busy cores, past the coordinator's usual wait for a worker to report ready.
            wait = {"start_timeout": COMPILE_START_TIMEOUT_S} if self.options.runtime.compile else {}
            pipe = Coordinator(self.config, placement=self.placement, max_in_flight=self.options.max_in_flight, **wait)
            self._pipe = pipe.start()
        return self

    def __enter__(self) -> "Captioner":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        self.decoder.close()  # its fork server and any live source's child; used again, it starts anew

    def _running(self) -> Coordinator:
        if self._pipe is None:
            raise PipelineError("the captioner is not started: call start() or use it in a with block")
        return self._pipe

    def answers(
        self,
        requests: Iterable[tuple[Hashable, Request]],
        on_text: Callable[[Hashable, str], None] | None = None,
    ) -> Iterator[tuple[Hashable, Answer]]:
        """``(request_id, Answer)`` for each request as it finishes: the answer's text and the
        token ids behind it. Requests are drawn lazily, at most ``options.max_in_flight`` in
        flight; for callers that bring their own images (the bench). With
        ``options.stream_answers``, ``on_text(request_id, piece)`` gets each answer's text as it
        is generated, on this thread, before the answer."""
        on_chunk = on_text if self.options.stream_answers else None
        for future in self._running().as_completed(requests, on_chunk=on_chunk):
            yield future.request_id, future.result()

    def captions(self, info: media.MediaInfo, progress: Progress | None = None) -> Iterator[Cue | Dropped]:
        """Cues for one probed input, in timeline order, each with its answer's token ids (and
        pictures of its frames with ``options.thumbnails``). A still gives one cue at 0. A live
        source (``info.live``) also gives a ``Dropped`` for each run of windows skipped to keep
        within ``options.max_lag``, in its place in the timeline (``ffai.run.live``)."""
        progress = progress or Progress()
        if info.live:
            yield from self._live_cues(info, progress)
            return
        yield from self._file_cues(info, progress)

    def _live_cues(self, info: media.MediaInfo, progress: Progress) -> Iterator[Cue | Dropped]:
        # Windows go to the model as it has room (ffai.run.live); cues are numbered in output order,
        # skipped windows taking no number, and a window's number is known when it is submitted.
        o, pipe = self.options, self._running()
        timing: dict[int, Cue] = {}  # the windows in flight
        numbers = itertools.count(1)
        frames = window_source.frames(self.decoder, info, o, progress.on_frame)
        windows = live.LiveWindows(frames, o.window, o.fps, o.max_lag, name=media.source_label(info.path))
        on_text = _CueText(progress, lambda window: timing[window].index) if progress.on_text else None

        def submit(request_id: int, window: Window, sink) -> object:
            item = window_source.window_item(window, o)
            timing[request_id] = dataclasses.replace(item.timing, index=next(numbers))
            return pipe.submit(request_id, item.request, on_chunk=sink)

        on_chunk = on_text if o.stream_answers else None
        for item in live.live_answers(windows, submit, pipe.abort, o.max_in_flight, on_chunk):
            if isinstance(item, Dropped):
                yield item
                continue
            window, answer = item
            if on_text:
                on_text.end(window.index)
            yield _emit(answered_cue(timing.pop(window.index), answer), progress)

    def _file_cues(self, info: media.MediaInfo, progress: Progress) -> Iterator[Cue]:
        # A still is one window. Windows are submitted as they are decoded, at most
        # max_in_flight at once; they may finish out of order and are released in order.
        timing: dict[int, Cue] = {}

        def requests() -> Iterator[tuple[int, Request]]:
            for item in window_source.window_items(self.decoder, info, self.options, progress.on_frame):
                timing[item.index] = item.timing
                yield item.index, item.request

        on_text = _CueText(progress, lambda window: window + 1) if progress.on_text else None
        cues = InOrder[Cue]()
        for request_id, answer in self.answers(requests(), on_text):
            if on_text:
                on_text.end(request_id)
            for cue in cues.add(request_id, answered_cue(timing.pop(request_id), answer)):
                yield _emit(cue, progress)


class _CueText:
    """``on_text`` for ``answers``: each request's pieces trimmed as its cue's text will be
    (``answered_cue``), then given to ``progress.on_text`` with the cue's index."""

    def __init__(self, progress: Progress, cue_index: Callable[[Hashable], int]) -> None:
        self._show = progress.on_text
        self._cue_index = cue_index
        self._trimmed: dict[Hashable, StrippedPieces] = {}

    def __call__(self, request_id: Hashable, piece: str) -> None:
        if shown := self._trimmed.setdefault(request_id, StrippedPieces()).add(piece):
            self._show(self._cue_index(request_id), shown)

    def end(self, request_id: Hashable) -> None:
        """The request is answered: its pieces are all in."""
        self._trimmed.pop(request_id, None)


def _emit(cue: Cue, progress: Progress) -> Cue:
    if progress.on_cue:
        progress.on_cue(cue)
    return cue


def caption(inputs: str | Path | Iterable[str | Path], options: CaptionOptions | None = None) -> Iterator[Cue]:
    """Caption one or more images or videos; yields each input's cues in timeline order.

    Cue texts are the model's answers with surrounding whitespace stripped; ``cue.token_ids``
    are the tokens behind each. Every input is probed before the model loads.

    >>> for cue in caption("clip.mp4", CaptionOptions(fps=2, window=8)):
    ...     print(cue.start_ms, cue.text)
    """
    paths = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    captioner = Captioner(options or CaptionOptions())  # the cheap checks; nothing starts here
    try:
        # Probed by the decoder that samples them: a live source's probe leaves its reader there.
        infos = [captioner.decoder.probe(path) for path in paths]
        captioner.start(video=any(info.kind == "video" for info in infos))
        for info in infos:
            yield from captioner.captions(info)
    finally:
        captioner.close()
