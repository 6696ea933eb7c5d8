"""The caption job as a library: ``caption(inputs, options)`` yields cues.

This module owns the order of work: cheap checks first (options, engine, model folder,
window size against the context), weights only when the first window is ready. It knows
the engine only through the contract in ``ffai.engine``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from ffai import media, models, registry
from ffai.engine import DecodingOptions, DescribeRequest, Engine, RuntimeOptions, StageSpec
from ffai.errors import UsageError
from ffai.pipeline import Coordinator, PipelineConfig, ProcessConfig, StageConfig
from ffai.tracks import Cue
from ffai.windows import check_window, make_windows


@dataclass(frozen=True)
class CaptionOptions:
    """Everything a caption run needs, validated once here."""

    engine: str | None = None
    model: str | None = None
    fps: float = 1.0
    window: int = 8
    start: float = 0.0
    duration: float | None = None
    max_frames: int | None = None
    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    max_in_flight: int = 2
    workers: bool | None = None  # None: worker processes for video unless shares_one_process

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise UsageError("--max-in-flight must be at least 1")
        media.check_sampling(self.fps, self.start, self.duration, self.max_frames)
        check_window(self.window)


@dataclass
class Progress:
    """Callbacks a front end may set to follow a run; all optional."""

    on_frame: Callable[[float], None] | None = None
    on_cue: Callable[[Cue], None] | None = None


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# At or below this many cores every stage shares one process and the stages take turns, each
# with all the cores. Measured with `ffai bench vlm` on 2 cores: vision is most of the work, so
# two 1-thread processes side by side leave the text process idle much of the time, while one
# process holds one torch runtime and one set of weights instead of two (README, Speed).
SHARED_PROCESS_MAX_CORES = 2
SHARED_PROCESS = "engine"


def shares_one_process(cores: int) -> bool:
    return cores <= SHARED_PROCESS_MAX_CORES


def pipeline_config(stages: Sequence[StageSpec], model_dir: Path, runtime: RuntimeOptions, cores: int) -> PipelineConfig:
    """The engine's stages as a linear pipeline. On many cores each of the engine's processes
    gets its share of them, so that stages running side by side do not oversubscribe the
    machine; on few cores (``shares_one_process``) all stages share one process, serially."""
    shared = shares_one_process(cores)
    processes = [SHARED_PROCESS] if shared else list(dict.fromkeys(spec.process for spec in stages))
    threads = runtime.threads or max(1, cores // len(processes))
    configs = []
    for i, spec in enumerate(stages):
        last = i == len(stages) - 1
        configs.append(
            StageConfig(
                name=spec.name,
                factory=spec.factory,
                args=(str(model_dir), runtime),
                next=() if last else (stages[i + 1].name,),
                terminal=last,
                process=SHARED_PROCESS if shared else spec.process,
            )
        )
    placed = tuple(ProcessConfig(p, threads=threads, serial=shared) for p in processes)
    return PipelineConfig(stages=tuple(configs), processes=placed)


class Captioner:
    """A resolved engine and model folder, and the pipeline that runs it.

    The pipeline starts on first use (workers load the weights then) and serves every input
    of the run; ``close()`` (or leaving the ``with`` block) stops the workers. ``inline=True``
    runs the same stages as threads in this process: what a lone still needs, and what every
    run gets on few cores (``shares_one_process``), where one process is all the stages get.
    ``inline=False`` asks for worker processes whatever the cores; ``options.workers`` decides
    when it is set. ``cores`` (default: those this process may run on) is what placement and
    thread counts are planned for.
    """

    def __init__(self, options: CaptionOptions, *, inline: bool | None = None, cores: int | None = None) -> None:
        self.options = options
        self.cores = cores or available_cores()
        if options.workers is not None:
            inline = not options.workers
        self.inline = shares_one_process(self.cores) if inline is None else inline
        self.engine: Engine = registry.get_engine(options.engine)
        self.notice: str | None = None
        if options.model:
            self.model_name = options.model
        else:
            self.model_name, self.notice = models.default_model(self.engine.info.name, self.engine.info.default_model)
        self.model_dir: Path = models.resolve(self.model_name)
        self.engine.check_window(self.model_dir, options.window, options.decoding, split=False)
        self._pipe: Coordinator | None = None

    def __enter__(self) -> "Captioner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None

    @property
    def pipe(self) -> Coordinator:
        if self._pipe is None:
            config = pipeline_config(self.engine.stages(), self.model_dir, self.options.runtime, self.cores)
            self._pipe = Coordinator(config, inline=self.inline, max_in_flight=self.options.max_in_flight).start()
        return self._pipe

    def captions(self, info: media.MediaInfo, progress: Progress | None = None) -> Iterator[Cue]:
        """Cues for one probed input, in timeline order. A still gives one cue at 0."""
        progress = progress or Progress()
        if info.kind == "image":
            request = DescribeRequest((media.load_image(info.path),), self.options.decoding, split=True)
            text = self.pipe.submit("still", request).result().text.strip()
            yield _emit(Cue(index=1, start_ms=0, end_ms=0, frame_times_ms=(0,), text=text), progress)
            return
        yield from self._video_cues(info, progress)

    def _video_cues(self, info: media.MediaInfo, progress: Progress) -> Iterator[Cue]:
        # Windows are submitted as they are decoded, at most max_in_flight at once; they may
        # finish out of order, so finished cues wait in a small buffer for their turn.
        timing: dict[int, Cue] = {}
        finished: dict[int, str] = {}
        next_index = 0

        def requests() -> Iterator[tuple[int, DescribeRequest]]:
            windows = make_windows(self._frames(info, progress), self.options.window, self.options.fps, clip_end=info.duration)
            for window in windows:
                timing[window.index] = Cue.from_window(window, "")
                images = tuple(frame.image for frame in window.frames)
                yield window.index, DescribeRequest(images, self.options.decoding, split=False)

        for future in self.pipe.as_completed(requests()):
            finished[future.request_id] = future.result().text.strip()
            while next_index in finished:
                cue = dataclasses.replace(timing.pop(next_index), text=finished.pop(next_index))
                next_index += 1
                yield _emit(cue, progress)

    def _frames(self, info: media.MediaInfo, progress: Progress) -> Iterable[media.Frame]:
        o = self.options
        for frame in media.sample_frames(info.path, o.fps, start=o.start, duration=o.duration, max_frames=o.max_frames):
            if progress.on_frame:
                progress.on_frame(frame.time)
            yield frame


def _emit(cue: Cue, progress: Progress) -> Cue:
    if progress.on_cue:
        progress.on_cue(cue)
    return cue


def caption(inputs: str | Path | Iterable[str | Path], options: CaptionOptions | None = None) -> Iterator[Cue]:
    """Caption one or more images or videos; yields each input's cues in timeline order.

    Cue texts are the model's answers with surrounding whitespace stripped.

    >>> for cue in caption("clip.mp4", CaptionOptions(fps=2, window=8)):
    ...     print(cue.start_ms, cue.text)
    """
    paths = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    with Captioner(options or CaptionOptions()) as captioner:
        for path in paths:
            yield from captioner.captions(media.probe(path))
