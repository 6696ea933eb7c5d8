"""The engine contract: what the core and the pipeline may rely on, and nothing more.

An engine plugin is an object registered under the entry-point group ``ffai.engines``.
It carries an :class:`EngineInfo`, answers cheap questions from the checkpoint's small
files (``check_window``) and loads a model lazily (``load``). The loaded model offers the
three pipeline stages as plain functions plus ``describe`` for direct library use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from ffai.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover - typing only; torch and PIL load lazily
    from PIL import Image

STATUSES = ("experimental", "stable")
# A checkpoint's tensors are stored in one of these; ffai runs in these or, opt-in, in int8
# (int8 weights made at load time, activations quantised per step: README, *Precision and speed*).
TENSOR_DTYPES = ("float32", "bfloat16")
DTYPES = (*TENSOR_DTYPES, "int8")
DEVICES = ("auto", "cpu", "cuda")


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
    """

    prompt: str | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    force_new_tokens: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise UsageError("--max-new-tokens must be at least 1")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise UsageError("--temperature must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise UsageError("--top-p must be in (0, 1]")
        if self.top_k < 0:
            raise UsageError("--top-k must be >= 0")
        if self.prompt is not None and not self.prompt.strip():
            raise UsageError("--prompt must not be empty")
        wants_sampling = self.temperature > 0 or self.top_p < 1 or self.top_k > 0
        if wants_sampling and self.seed is None:
            raise UsageError("sampling (--temperature/--top-p/--top-k) needs --seed so runs are reproducible")
        if wants_sampling and self.temperature == 0:
            raise UsageError("--top-p/--top-k need --temperature > 0")


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how a model runs. ``dtype`` float32 is exact (token-identical to the reference);
    bfloat16 and int8 are opt-in and change rounding. ``threads`` is torch's thread count in each pipeline process
    (None: the cores shared out between them, ``ffai.captioning.pipeline_config``); the pipeline
    sets it, an engine never does."""

    dtype: str = "float32"
    device: str = "auto"
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise UsageError(f"--device must be one of {', '.join(DEVICES)}")
        if self.threads is not None and self.threads < 1:
            raise UsageError("--threads must be at least 1")


@dataclass(frozen=True)
class DescribeRequest:
    """What the core submits to an engine's first stage for one window or still."""

    images: tuple  # PIL images, RGB
    options: DecodingOptions
    split: bool


@dataclass(frozen=True)
class Answer:
    """What an engine's last stage returns for one request: the text and the tokens behind it
    (the bench compares tokens between implementations)."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class StageSpec:
    """One stage of an engine's pipeline, as the core places it: in this process or in a worker
    process (``ffai.captioning.placement``).

    ``factory`` is a ``"module:function"`` importable in a fresh process; it is called as
    ``factory(model_dir, runtime)`` and returns a function from the previous stage's output
    (a DescribeRequest for the first stage) to this stage's output (an Answer, for the last).
    Stages sharing a ``process`` name share a worker process when the stages run in workers
    on more than a few cores (``ffai.captioning.pipeline_config``).

    The last stage's function also takes a keyword ``on_text``: when given, it is called with
    each piece of the answer's text as soon as no later token can change that piece, and the
    pieces add up to ``Answer.text`` (the core passes it when a run shows answers as they are
    generated, ``ffai.streaming``).
    """

    name: str
    factory: str
    process: str


class LoadedModel(Protocol):
    """A model with its weights in memory. The three stages compose into ``describe``.

    ``split`` chooses tiling: True for a still image (tiles + global image), False for
    video frames (one unsplit image each).
    """

    def preprocess(self, images: Sequence["Image.Image"], options: DecodingOptions, *, split: bool) -> Any: ...

    def encode(self, prepared: Any) -> Any: ...

    def generate(self, encoded: Any, options: DecodingOptions, on_text: Callable[[str], None] | None = None) -> str:
        """The answer's text; ``on_text`` gets it piece by piece as it is generated."""
        ...

    def describe(self, images: Sequence["Image.Image"], options: DecodingOptions, *, split: bool) -> str: ...


class Engine(Protocol):
    info: EngineInfo

    def check_window(self, model_dir: Path, n_images: int, options: DecodingOptions, *, split: bool) -> None:
        """Refuse (UsageError naming --window) a request whose prompt cannot fit the context.
        Reads only the checkpoint's small files; never loads weights."""

    def load(self, model_dir: Path, runtime: RuntimeOptions) -> LoadedModel: ...

    def stages(self) -> Sequence[StageSpec]:
        """The pipeline, first stage to last: DescribeRequest in, Answer out."""
