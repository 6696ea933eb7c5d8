"""What ``--ray`` runs on the cluster: a task that decodes one input into windows, and an actor
that hosts the engine's pipeline.

Nothing here imports Ray: the driver (``ffai.ray.backend``) wraps ``decode_input`` as a
streaming-generator task and ``EngineActor`` as an actor class. Decoding is ``ffai.media``'s
(a ``Decoder`` child per file, the same PTS sampling and windows as a local run); the actor
runs the engine's own stages through ``ffai.run.captioner.pipeline_config`` and the pipeline's
inline runner, so the cluster computes exactly what a local run computes.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ffai import media
from ffai.engines.contract import Answer, NoRoomYet, RuntimeOptions, StageSpec
from ffai.errors import FfaiError
from ffai.outputs.cues import Cue
from ffai.pipeline import ContinuousWrapper, Coordinator, PipelineConfig, is_continuous
from ffai.pipeline.config import resolve
from ffai.run.captioner import pipeline_config
from ffai.run.options import CaptionOptions
from ffai.run.window_source import WindowItem, window_items


@dataclass(frozen=True)
class Failed:
    """An input that cannot be captioned (a bad file, a stage that refused it): the one-line
    reason. It travels in place of a window, so it arrives in timeline order."""

    error: str


@dataclass(frozen=True)
class WindowResult:
    index: int
    timing: Cue
    answer: Answer
    decode_s: float


def decode_input(source: str, options: CaptionOptions, cwd: str) -> Iterator[Any]:
    """Yield the probed ``MediaInfo`` (or ``Failed``), then each window as a ``WindowItem``
    (a still is one window), or ``Failed`` where decoding stops on an error. A relative
    ``source`` is read from the driver's working folder ``cwd`` where this node has it, so paths
    and messages read as in a local run (a worker runs one task at a time)."""
    if os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    with media.Decoder() as decoder:  # a child per file: a decoder crash fails this input alone
        try:
            info = decoder.probe(source)
        except FfaiError as e:
            yield Failed(str(e))
            return
        yield info
        try:
            yield from window_items(decoder, info, options)
        except FfaiError as e:
            yield Failed(str(e))


# Seconds and calls per stage in this actor process, filled by the timed stage functions.
_stage_clock: dict[str, list[float]] = {}
_stage_clock_lock = threading.Lock()


def timed_stage(name: str, factory: str, *args: Any) -> Any:
    """The engine's stage ``factory(*args)``, timed per call (``EngineActor.stage_seconds``); a
    continuous stage's joins and steps are its time, its joins its calls."""
    fn = resolve(factory)(*args)
    if is_continuous(fn):
        return _TimedContinuous(name, fn)

    def run(payload: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(payload)
        finally:
            _clock(name, time.perf_counter() - start, 1)

    return run


def _clock(name: str, seconds: float, calls: int) -> None:
    with _stage_clock_lock:
        clock = _stage_clock.setdefault(name, [0.0, 0])
        clock[0] += seconds
        clock[1] += calls


class _TimedContinuous(ContinuousWrapper):
    """A continuous stage (``ffai.pipeline.scheduler.ContinuousScheduler``) whose joins and steps
    are timed."""

    def __init__(self, name: str, stage: Any) -> None:
        super().__init__(stage)
        self.name = name

    def join(self, key: Any, payload: Any) -> Any:
        start, calls = time.perf_counter(), 1
        try:
            return self.stage.join(key, payload)
        except NoRoomYet:
            calls = 0  # not joined: the window is offered again, and counted then
            raise
        finally:
            _clock(self.name, time.perf_counter() - start, calls)

    def step(self) -> list:
        start = time.perf_counter()
        try:
            return self.stage.step()
        finally:
            _clock(self.name, time.perf_counter() - start, 0)


def actor_pipeline(stages: list[StageSpec], model_dir: Path, runtime: RuntimeOptions, cores: int) -> PipelineConfig:
    """The local pipeline's configuration for an actor's ``cores``, every stage timed."""
    config = pipeline_config(stages, model_dir, runtime, cores)
    timed = tuple(dataclasses.replace(s, factory=timed_stage, args=(s.name, s.factory, *s.args)) for s in config.stages)
    return PipelineConfig(stages=timed, processes=config.processes)


class EngineActor:
    """The engine's whole pipeline in one actor, inline: its stages load their weights once,
    here, with torch's threads set to the actor's CPUs by the pipeline (``ProcessConfig``).
    ``caption`` may be called from several of the actor's threads at once; the pipeline keeps
    at most ``in_flight`` windows in its stages."""

    def __init__(
        self, stages: list[StageSpec], model_dir: str, runtime: RuntimeOptions, cores: int, in_flight: int
    ) -> None:
        self._error: str | None = None
        self._pipe: Coordinator | None = None
        self._ids = itertools.count()
        try:
            config = actor_pipeline(stages, Path(model_dir), runtime, cores)
            self._pipe = Coordinator(config, placement="inline", max_in_flight=in_flight).start()
        except FfaiError as e:  # reported by ready(), so the driver prints one line
            self._error = str(e)

    def ready(self) -> tuple[int, str | None]:
        """This actor's pid, and the reason its pipeline did not start (None when it did)."""
        return os.getpid(), self._error

    def caption(self, item: WindowItem | Failed) -> WindowResult | Failed:
        if isinstance(item, Failed):
            return item
        if self._pipe is None:
            return Failed(self._error or "the engine did not start")
        try:
            answer = self._pipe.submit(next(self._ids), item.request).result()
        except FfaiError as e:
            return Failed(str(e))
        return WindowResult(item.index, item.timing, answer, item.decode_s)

    def stage_seconds(self) -> dict[str, tuple[float, int]]:
        with _stage_clock_lock:
            return {name: (clock[0], int(clock[1])) for name, clock in _stage_clock.items()}

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
