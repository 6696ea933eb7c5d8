"""Pipeline configuration: plain dataclasses, validated once before any worker starts.

A :class:`PipelineConfig` lists :class:`StageConfig` s and, optionally, per-process
settings (:class:`ProcessConfig`: torch threads, an init function). Stages sharing a
``process`` name run in the same worker process; a stage without one gets a process of its
own, named after the stage.

Callables that must cross into spawned worker processes (``factory``, ``route_fn``,
``merge_fn``, the values of ``project_payload``, ``init``) are given as ``"module:attr"``
strings or as importable top-level functions; a lambda or closure is refused at start for
the ``"workers"`` placement (it cannot be pickled) and accepted inline.

A stage's ``factory(*args, **kwargs)`` runs inside its worker and returns either a
:class:`~ffai.pipeline.scheduler.Scheduler` or a plain callable. A callable becomes
``SimpleScheduler(fn)`` when ``max_batch_size == 1`` and
``SimpleScheduler(batch_fn=fn, max_batch_size=..., max_batch_wait_ms=...,
batch_wait_when_idle=...)`` otherwise.

Routing: ``terminal=True`` sends the result to the caller; ``next`` names the stages that
receive it (all of them, or those ``route_fn(result)`` picks among ``next``);
``project_payload={target: fn}`` gives each target ``fn(result)`` instead of the whole
result. A stage with ``wait_for`` collects one payload from each named source for a request
and runs ``merge_fn({source: payload})`` (on the worker's receive thread: keep it cheap).
``stream_to`` names the stages that get this stage's stream chunks, then ``stream_done``
when this stage finishes the request; without it the chunks go to the caller (name
:data:`~ffai.pipeline.messages.CALLER` among the targets to send them there as well). A request is
answered by the first terminal result that reaches the caller.
"""

from __future__ import annotations

import importlib
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable

from ffai.pipeline.errors import ConfigError
from ffai.pipeline.messages import CALLER


def resolve(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """A callable from a ``"module:attr"`` string (dotted attr allowed), or ``ref`` itself."""
    if callable(ref):
        return ref
    module_name, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _names(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class StageConfig:
    name: str
    factory: str | Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    next: tuple[str, ...] = ()
    route_fn: str | Callable[[Any], Any] | None = None
    terminal: bool = False
    process: str | None = None
    wait_for: tuple[str, ...] = ()
    merge_fn: str | Callable[[dict[str, Any]], Any] | None = None
    project_payload: dict[str, str | Callable[[Any], Any]] = field(default_factory=dict)
    stream_to: tuple[str, ...] = ()
    max_batch_size: int = 1
    max_batch_wait_ms: float = 0
    batch_wait_when_idle: bool = False

    def __post_init__(self) -> None:
        # Accept a single name or a list where a tuple of names is meant.
        for name in ("next", "wait_for", "stream_to"):
            object.__setattr__(self, name, _names(getattr(self, name)))
        object.__setattr__(self, "args", tuple(self.args))

    @property
    def process_name(self) -> str:
        return self.process or self.name


@dataclass(frozen=True)
class ProcessConfig:
    """Settings of one worker process. ``threads`` is applied with ``torch.set_num_threads``
    (and the OpenMP/MKL environment) before any stage is built; ``init(*init_args,
    **init_kwargs)`` runs next, once per process (seeds, loading shared state).

    ``serial=True`` makes the process's stages take turns: one stage function runs at a time,
    each with all ``threads``. Stages sharing few cores otherwise run side by side, each with
    its own OpenMP team, more threads than cores. (Inline, every stage is in the one process:
    serial if any process asks for it.)"""

    name: str
    threads: int | None = None
    serial: bool = False
    init: str | Callable[..., Any] | None = None
    init_args: tuple[Any, ...] = ()
    init_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineConfig:
    stages: tuple[StageConfig, ...]
    processes: tuple[ProcessConfig, ...] = ()
    entry: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "processes", tuple(self.processes))

    def stage(self, name: str) -> StageConfig:
        return next(s for s in self.stages if s.name == name)

    def process_groups(self) -> dict[str, list[str]]:
        """Process name -> the names of its stages, in config order."""
        groups: dict[str, list[str]] = {}
        for s in self.stages:
            groups.setdefault(s.process_name, []).append(s.name)
        return groups

    def process_config(self, name: str) -> ProcessConfig:
        return next((p for p in self.processes if p.name == name), ProcessConfig(name))

    def entry_stage(self) -> str:
        if self.entry is not None:
            return self.entry
        targets = {t for s in self.stages for t in (*s.next, *s.stream_to)}
        entries = [s.name for s in self.stages if s.name not in targets]
        if not entries:
            raise ConfigError("no entry stage: every stage receives from another; set entry=")
        if len(entries) > 1:
            raise ConfigError(f"several entry stages ({', '.join(entries)}); set entry= to one of them")
        return entries[0]

    def validate(self, *, crossing_processes: bool) -> None:
        """Raise :class:`ConfigError` naming the first problem found."""
        if not self.stages:
            raise ConfigError("a pipeline needs at least one stage")
        names = [s.name for s in self.stages]
        _check_unique("stage", names)
        _check_unique("process", [p.name for p in self.processes])
        for s in self.stages:
            _check_stage(s, set(names))
        _check_fan_in(self)
        _check_processes(self)
        entry = self.entry_stage()
        if entry not in names:
            raise ConfigError(f"entry stage {entry!r} is not a stage")
        if self.stage(entry).wait_for:
            raise ConfigError(f"entry stage {entry!r} cannot wait_for other stages")
        if not any(s.terminal for s in self.stages):
            raise ConfigError("no terminal stage: set terminal=True on the stage whose result is the answer")
        if crossing_processes:
            _check_picklable(self)


def _check_unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"duplicate {kind} name {name!r}")
        seen.add(name)


def _check_stage(s: StageConfig, names: set[str]) -> None:
    where = f"stage {s.name!r}"
    if not s.name or s.name.startswith("@"):
        raise ConfigError(f"{where}: a stage name must be non-empty and not start with '@'")
    if s.next and s.terminal:
        raise ConfigError(f"{where}: has both next= and terminal=True; choose one")
    if not s.next and not s.terminal:
        raise ConfigError(f"{where}: its result goes nowhere; set next= or terminal=True")
    if s.route_fn is not None and not s.next:
        raise ConfigError(f"{where}: route_fn needs next= (it may only choose among those)")
    for target in s.next:
        if target not in names:
            raise ConfigError(f"{where}: next names unknown stage {target!r}")
    for target in s.stream_to:
        if target not in names and target != CALLER:
            raise ConfigError(f"{where}: stream_to names unknown stage {target!r}")
    for target in s.project_payload:
        if target not in s.next:
            raise ConfigError(f"{where}: project_payload names {target!r}, which is not in next")
    if s.wait_for and s.merge_fn is None:
        raise ConfigError(f"{where}: wait_for needs merge_fn to combine the parts")
    if s.merge_fn is not None and not s.wait_for:
        raise ConfigError(f"{where}: merge_fn without wait_for would never run")
    if s.max_batch_size < 1 or s.max_batch_wait_ms < 0:
        raise ConfigError(f"{where}: max_batch_size must be >= 1 and max_batch_wait_ms >= 0")
    for label, ref in _refs(s):
        _check_ref(f"{where}: {label}", ref)


def _check_fan_in(config: PipelineConfig) -> None:
    for s in config.stages:
        for source in s.wait_for:
            sender = next((x for x in config.stages if x.name == source), None)
            if sender is None:
                raise ConfigError(f"stage {s.name!r}: wait_for names unknown stage {source!r}")
            if s.name not in sender.next:
                raise ConfigError(f"stage {s.name!r}: waits for {source!r}, which does not send to it")


def _check_processes(config: PipelineConfig) -> None:
    groups = config.process_groups()
    for p in config.processes:
        if p.name not in groups:
            raise ConfigError(f"process {p.name!r} has no stages")
        if p.threads is not None and p.threads < 1:
            raise ConfigError(f"process {p.name!r}: threads must be >= 1")
        if p.init is not None:
            _check_ref(f"process {p.name!r}: init", p.init)


def _refs(s: StageConfig) -> list[tuple[str, Any]]:
    refs: list[tuple[str, Any]] = [("factory", s.factory)]
    if s.route_fn is not None:
        refs.append(("route_fn", s.route_fn))
    if s.merge_fn is not None:
        refs.append(("merge_fn", s.merge_fn))
    refs += [(f"project_payload[{t!r}]", fn) for t, fn in s.project_payload.items()]
    return refs


def _check_ref(where: str, ref: Any) -> None:
    if callable(ref):
        return
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise ConfigError(f"{where}: expected a callable or a 'module:attr' string, got {ref!r}")


def _check_picklable(config: PipelineConfig) -> None:
    for s in config.stages:
        for label, value in [*_refs(s), ("args", s.args), ("kwargs", s.kwargs)]:
            _try_pickle(f"stage {s.name!r}: {label}", value)
    for p in config.processes:
        _try_pickle(f"process {p.name!r}", p)


def _try_pickle(where: str, value: Any) -> None:
    try:
        pickle.dumps(value)
    except Exception as e:
        raise ConfigError(
            f"{where} cannot be sent to a worker process ({e}); "
            "give a 'module:attr' string or an importable top-level function"
        ) from e
