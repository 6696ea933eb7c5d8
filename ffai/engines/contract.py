"""The engine contract: what the core and the pipeline may rely on, and nothing more.

An engine is an object registered under the entry-point group ``ffai.engines`` (light: importing
it must not import torch). It has three parts:

- ``info``: an :class:`EngineInfo` (name, task, status, description, default model);
- ``check_window(model_dir, frames, options)``: refuse, from the checkpoint's small files alone,
  a window whose prompt cannot fit the model's context (never loads weights);
- ``stages()``: the pipeline as :class:`StageSpec` factories, first to last: a :class:`Request`
  in, an :class:`Answer` out.

Optionally ``bench``: the hooks ``ffai bench vlm`` needs (:class:`ffai.bench.hooks.BenchHooks`),
``kernels(flags)``: which kernels run each dtype on a CPU with those flags, which ``ffai engines``
prints beside the host's fast dtypes (torch-free, like ``info``), and ``model_types``:
the config.json ``model_type`` values it runs, so that a checkpoint folder given without
``--engine`` finds its engine (``ffai.engines.registry.engine_for_model``).

A request says what it holds in engine-neutral terms (a still, or frames with their source
times); the engine decides tiling and prompt. The core places the stages inline or in worker
processes (``ffai.run.captioner``), on Ray actors (``ffai.ray.workers``) or chains them in this
process for library use (``ffai.run.inline.InlineEngine``): the same factories everywhere.
An engine built on the kit (``ffai.kit``) gets its stages from ``ffai.kit.stages``; docs/engines.md
walks through adding one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from ffai.errors import UsageError

STATUSES = ("experimental", "stable")
# A checkpoint's tensors are stored in one of these; ffai runs in these or, opt-in, in int8
# (int8 weights made at load time, activations quantised per step: docs/precision-and-speed.md).
TENSOR_DTYPES = ("float32", "bfloat16")
DTYPES = (*TENSOR_DTYPES, "int8")
DEVICES = ("auto", "cpu", "cuda")
# How a window's frames reach a model: as one video clip with its frame times, or as separate
# pictures. Engines offer what their checkpoint supports (docs/caption.md, --window-as).
WINDOW_PRESENTATIONS = ("video", "images")
# The pixel budgets' flags, in DecodingOptions' field order (docs/caption.md, Pixel budgets).
PIXEL_FLAGS = ("--min-pixels", "--max-pixels", "--frame-min-pixels", "--frame-max-pixels")


@dataclass(frozen=True)
class EngineInfo:
    name: str
    task: str
    status: str
    description: str
    default_model: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"engine {self.name!r}: status must be one of {STATUSES}")


@dataclass(frozen=True)
class DecodingOptions:
    """How to decode one request. Validated once, here; engines trust it afterwards.

    ``prompt=None`` lets the engine use its default question. ``force_new_tokens`` makes the
    engine produce exactly ``max_new_tokens`` tokens whatever stop tokens appear (gates, bench).
    Greedy decoding (temperature 0) needs no seed; sampling does, so runs are reproducible.
    ``repetition_penalty`` (1.0: off) divides the positive logits and multiplies the negative
    ones of every token already in the prompt or the answer, before greedy or sampled choice
    (transformers' ``repetition_penalty``). ``stop``: strings that end an answer where its text
    first holds one; the answer is the text before it (``ffai.kit.stop_strings``).
    ``window_as`` is how a window's frames are presented (``WINDOW_PRESENTATIONS``); None lets
    the engine choose (video where its checkpoint supports it); an engine refuses one its
    checkpoint lacks.
    The pixel budgets bound how many pixels a model sees, for engines that resize to a budget
    rather than to a fixed size: ``min_pixels``/``max_pixels`` per still image,
    ``frame_min_pixels``/``frame_max_pixels`` per frame of a window; None keeps the checkpoint's
    own. An engine that sizes pictures otherwise refuses them (``check_window``), saying how it does.
    """

    prompt: str | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    force_new_tokens: bool = False
    window_as: str | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    frame_min_pixels: int | None = None
    frame_max_pixels: int | None = None

    def __post_init__(self) -> None:
        budgets = (self.min_pixels, self.max_pixels, self.frame_min_pixels, self.frame_max_pixels)
        for flag, value in zip(PIXEL_FLAGS, budgets):
            if value is not None and value < 1:
                raise UsageError(f"{flag} must be at least 1, got {value}")
        for i in (0, 2):  # each minimum against its maximum
            low, high = budgets[i : i + 2]
            if low is not None and high is not None and low > high:
                raise UsageError(f"{PIXEL_FLAGS[i]} {low} is more than {PIXEL_FLAGS[i + 1]} {high}")
        if self.window_as is not None and self.window_as not in WINDOW_PRESENTATIONS:
            raise UsageError(f"--window-as must be one of {', '.join(WINDOW_PRESENTATIONS)}")
        if self.max_new_tokens < 1:
            raise UsageError("--max-new-tokens must be at least 1")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise UsageError("--temperature must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise UsageError("--top-p must be in (0, 1]")
        if self.top_k < 0:
            raise UsageError("--top-k must be >= 0")
        if any(not isinstance(stop, str) or stop == "" for stop in self.stop):
            raise UsageError("--stop must not be empty")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise UsageError(
                f"--repetition-penalty must be a finite number > 0 (1.0: off), got {self.repetition_penalty}"
            )
        if self.prompt is not None and not self.prompt.strip():
            raise UsageError("--prompt must not be empty")
        wants_sampling = self.temperature > 0 or self.top_p < 1 or self.top_k > 0
        if wants_sampling and self.seed is None:
            raise UsageError("sampling (--temperature/--top-p/--top-k) needs --seed so runs are reproducible")
        if wants_sampling and self.temperature == 0:
            raise UsageError("--top-p/--top-k need --temperature > 0")

    @property
    def pixel_flags(self) -> tuple[str, ...]:
        """The pixel-budget flags given, by name (an engine that cannot honour them names them)."""
        given = zip(PIXEL_FLAGS, (self.min_pixels, self.max_pixels, self.frame_min_pixels, self.frame_max_pixels))
        return tuple(flag for flag, value in given if value is not None)


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how a model runs. ``dtype`` float32 is exact (token-identical to the reference);
    bfloat16 and int8 are opt-in and change rounding. ``threads`` is torch's thread count in each pipeline process
    (None: the cores shared out between them, ``ffai.run.captioner.pipeline_config``); the pipeline
    sets it, an engine never does. ``compile``: an opt-in dtype may run parts the engine compiles
    for this machine once (cached under ffai's home; SmolVLM's int8 decode step), which round
    otherwise than its eager ones; float32 never compiles. ``batch``: how many windows the text
    stage may decode at once (1: one at a time); a window's tokens are the same either way."""

    dtype: str = "float32"
    device: str = "auto"
    threads: int | None = None
    compile: bool = False
    batch: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise UsageError(f"--device must be one of {', '.join(DEVICES)}")
        if self.threads is not None and self.threads < 1:
            raise UsageError("--threads must be at least 1")
        if self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.compile and self.dtype == "float32":
            raise UsageError("--compile is for the opt-in dtypes (--dtype int8): float32 runs its exact eager path")


@dataclass(frozen=True)
class Request:
    """What the core asks an engine about one still or one window of frames.

    ``times`` is None for a still image (one picture), else each frame's time in its source, in
    seconds, and ``span`` the window's (start, end) there: video models write frame times into
    their prompts. The engine decides how to tile and present either."""

    images: tuple  # PIL images, RGB
    options: DecodingOptions
    times: tuple[float, ...] | None = None
    span: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not self.images:
            raise ValueError("a request holds at least one image")
        if self.times is None and (len(self.images) != 1 or self.span is not None):
            raise ValueError("a still request holds one image and no span")
        if self.times is not None and len(self.times) != len(self.images):
            raise ValueError(f"{len(self.images)} frames with {len(self.times)} times")

    @property
    def still(self) -> bool:
        return self.times is None

    @classmethod
    def frames(cls, images, times, options: DecodingOptions, span: tuple[float, float] | None = None) -> "Request":
        """A window of frames; ``span`` defaults to the first frame's time to the last one's."""
        times = tuple(float(t) for t in times)
        return cls(tuple(images), options, times, span or (times[0], times[-1]))

    @classmethod
    def of(cls, images, times, options: DecodingOptions) -> "Request":
        """A still when ``times`` is None, else a window of frames at those times."""
        return cls(tuple(images), options) if times is None else cls.frames(images, times, options)


@dataclass(frozen=True)
class Answer:
    """What an engine's last stage returns for one request: the text and the tokens behind it
    (the bench compares tokens between implementations)."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class StageSpec:
    """One stage of an engine's pipeline, as the core places it: in this process or in a worker
    process (``ffai.run.captioner.placement``).

    ``factory`` is a ``"module:function"`` importable in a fresh process; it is called as
    ``factory(model_dir, runtime)`` and returns a function from the previous stage's output
    (a Request for the first stage) to this stage's output (an Answer, for the last).
    Stages sharing a ``process`` name share a worker process when the stages run in workers
    on more than a few cores (``ffai.run.captioner.pipeline_config``).

    The last stage's function also takes a keyword ``on_text``: when given, it is called with
    each piece of the answer's text as soon as no later token can change that piece, and the
    pieces add up to ``Answer.text`` (the core passes it when a run shows answers as they are
    generated, ``ffai.run.streaming``).

    The last stage may instead serve several requests at once (``RuntimeOptions.batch`` > 1): an
    object with ``join(key, payload, on_text=None)``, ``step()``, ``drop(key)``, ``active()`` and
    ``max_active``, which the pipeline runs with its continuous scheduler
    (``ffai.pipeline.scheduler.ContinuousScheduler``); called as a function it answers one request
    alone. The kit's text stage is one (``ffai.kit.stages.BatchedTextDecoder``). Its ``join`` may
    raise :class:`NoRoomYet` while others are served: the request joins after a later step.
    """

    name: str
    factory: str
    process: str


class NoRoomYet(Exception):
    """A continuous stage cannot take a request now (its memory would not fit beside the requests
    it serves); the pipeline offers it again once one of those has ended."""


class Engine(Protocol):
    info: EngineInfo

    def check_window(self, model_dir: Path, frames: int, options: DecodingOptions) -> None:
        """Refuse (UsageError naming --window) a window of ``frames`` frames whose prompt cannot
        fit the context. Reads only the checkpoint's small files; never loads weights."""

    def stages(self) -> Sequence[StageSpec]:
        """The pipeline, first stage to last: Request in, Answer out."""
