"""An engine's stages built and chained in this process: the library's, the bench's and the
tests' way to run a model without a pipeline.

The stages come from the same ``StageSpec`` factories the pipeline places in threads, worker
processes or Ray actors, so what runs here is what ``ffai caption`` runs; there is no second
"loaded model" API for an engine to implement.

>>> model = InlineEngine.load("smolvlm", "models/smolvlm-demo")
>>> model(Request((image,), DecodingOptions())).text
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ffai.engines.contract import Answer, Engine, Request, RuntimeOptions
from ffai.kit.host import release_free_heap
from ffai.pipeline.config import resolve


class InlineEngine:
    """Every stage of ``engine`` built on ``model_dir`` for ``runtime``, first to last."""

    def __init__(self, engine: Engine, model_dir: str | Path, runtime: RuntimeOptions | None = None) -> None:
        self.engine = engine
        self.model_dir = Path(model_dir)
        self.runtime = runtime or RuntimeOptions()
        self.stages: dict[str, Callable[..., Any]] = {
            spec.name: resolve(spec.factory)(str(self.model_dir), self.runtime) for spec in engine.stages()
        }

    @classmethod
    def load(cls, engine: str | None, model: str | Path, runtime: RuntimeOptions | None = None) -> "InlineEngine":
        """The engine registered as ``engine`` (None: the one the model's manifest names, else the
        default) on a model name or folder."""
        from ffai import models
        from ffai.engines import registry

        return cls(registry.engine_for_model(engine, str(model)), models.resolve(str(model)), runtime)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        """The stage called ``name``: for probes that look inside one stage (tests, the bench)."""
        return self.stages[name]

    def through(self, request: Request, last: str) -> Any:
        """The request run through the stages up to and including the one called ``last``."""
        if last not in self.stages:
            raise KeyError(f"engine {self.engine.info.name!r} has no stage {last!r} (stages: {', '.join(self.stages)})")
        payload: Any = request
        for name, stage in self.stages.items():
            payload = _run(stage, payload)
            if name == last:
                break
        return payload

    def __call__(self, request: Request, on_text: Callable[[str], None] | None = None) -> Answer:
        """The answer; with ``on_text``, its text piece by piece as the last stage generates it."""
        *first, last = self.stages.values()
        payload: Any = request
        for stage in first:
            payload = _run(stage, payload)
        return _run(last, payload) if on_text is None else _run(last, payload, on_text=on_text)


def _run(stage: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One stage's call, then the heap's free pages handed back, as the pipeline does after each
    stage (``ffai.pipeline.worker``), so the next stage's peak does not sit on this one's garbage."""
    try:
        return stage(*args, **kwargs)
    finally:
        release_free_heap()
