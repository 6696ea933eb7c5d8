"""The caption job as a library: ``caption(inputs, options)`` yields cues.

This module owns the order of work: cheap checks first (options, engine, model folder,
window size against the context), weights only when the first window is ready. It knows
the engine only through the contract in ``ffai.engine``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ffai import media, models, registry
from ffai.engine import DecodingOptions, Engine, LoadedModel, RuntimeOptions
from ffai.errors import UsageError
from ffai.tracks import Cue
from ffai.windows import make_windows


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

    def __post_init__(self) -> None:
        if not math.isfinite(self.fps) or self.fps <= 0:
            raise UsageError("--fps must be a number > 0")
        if self.window < 1:
            raise UsageError("--window must be at least 1")
        if not math.isfinite(self.start) or self.start < 0:
            raise UsageError("-ss must be >= 0 seconds")
        if self.duration is not None and (not math.isfinite(self.duration) or self.duration <= 0):
            raise UsageError("-t must be > 0 seconds")
        if self.max_frames is not None and self.max_frames < 1:
            raise UsageError("--max-frames must be at least 1")


@dataclass
class Progress:
    """Callbacks a front end may set to follow a run; all optional."""

    on_frame: Callable[[float], None] | None = None
    on_cue: Callable[[Cue], None] | None = None


class Captioner:
    """A resolved engine and model folder; loads the weights on first use and keeps them
    for every input of the run."""

    def __init__(self, options: CaptionOptions) -> None:
        self.options = options
        self.engine: Engine = registry.get_engine(options.engine)
        self.notice: str | None = None
        if options.model:
            self.model_name = options.model
        else:
            self.model_name, self.notice = models.default_model(self.engine.info.name, self.engine.info.default_model)
        self.model_dir: Path = models.resolve(self.model_name)
        self.engine.check_window(self.model_dir, options.window, options.decoding, split=False)
        self._model: LoadedModel | None = None

    @property
    def model(self) -> LoadedModel:
        if self._model is None:
            self._model = self.engine.load(self.model_dir, self.options.runtime)
        return self._model

    def captions(self, info: media.MediaInfo, progress: Progress | None = None) -> Iterator[Cue]:
        """Cues for one probed input, in timeline order. A still gives one cue at 0."""
        progress = progress or Progress()
        if info.kind == "image":
            image = media.load_image(info.path)
            text = self.model.describe([image], self.options.decoding, split=True)
            yield _emit(Cue(index=1, start_ms=0, end_ms=0, frame_times_ms=(0,), text=text), progress)
            return
        frames = self._frames(info, progress)
        for window in make_windows(frames, self.options.window, self.options.fps, clip_end=info.duration):
            images = [frame.image for frame in window.frames]
            text = self.model.describe(images, self.options.decoding, split=False)
            yield _emit(Cue.from_window(window, text), progress)

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

    >>> for cue in caption("clip.mp4", CaptionOptions(fps=2, window=8)):
    ...     print(cue.start_ms, cue.text)
    """
    paths = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    captioner = Captioner(options or CaptionOptions())
    for path in paths:
        yield from captioner.captions(media.probe(path))
