"""``ffai caption --ray``: caption many inputs on a Ray cluster; the driver still writes.

Ray runs the one window path (``ffai.run.window_source``) with its parts placed on the cluster
(Ray Core, not Ray Data: docs/corpus-and-ray.md says why, docs/benchmarks.md measures it). Each
input's window source runs in a streaming-generator task (``ffai.ray.workers.decode_input``:
probe, then one object per window, held back once ``DECODE_AHEAD`` wait unread); the engine's
stages run on a pool of actors (``ffai.ray.pool.ActorPool``, the runner, as the ``Coordinator``
is locally); and this driver releases each input's answers in timeline order (``InOrder``) as
``InputEvent`` s (``ffai.run.input_events``), which ``ffai.run.jobs`` writes. It only moves object
references: windows travel from the decode task to an actor without passing through it, and at
most ``in_flight`` windows are between decoded and answered across the cluster, so its memory
does not grow with the corpus.

Faults: Ray runs each call at most once here (no restarts, no task retries). The pool sends a
window whose actor died to another actor and replaces the actor; an input whose decode task or
decoded windows were lost (a node gone) is decoded again here, its windows already answered
skipped; past ``MAX_ATTEMPTS`` the input fails as transient, for the driver's own retries.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

from ffai.errors import FfaiError, UsageError
from ffai.media import MediaInfo, is_live, is_url, source_label
from ffai.ray.pool import ActorPool, Lost, Outcome, cause_line, classify_fault, windows_per_actor
from ffai.ray.workers import EngineActor, Failed, WindowResult, decode_input
from ffai.run import interrupts
from ffai.run.captioner import Captioner
from ffai.run.input_events import InputEvent
from ffai.run.options import CaptionOptions
from ffai.run.window_source import InOrder, answered_cue

INSTALL_HINT = "pip install 'ffai[ray]'"
LOCAL = "local"  # --ray local: start a Ray of our own on this machine, stop it afterwards
AUTO = "auto"  # --ray alone: $RAY_ADDRESS, else a cluster started here with `ray start --head`
DECODE_AHEAD = 2  # windows a decode task may have ready before it waits for the driver to read them
MAX_ATTEMPTS = 3  # decodes of one input before it fails as transient
LOCAL_OBJECT_STORE_BYTES = 1 << 30  # a local Ray reserves 30 % of memory for objects unless capped


@dataclass(frozen=True)
class RayResources:
    """Flags that override what ``plan_resources`` derives from the cluster."""

    actors: int | None = None
    cpus_per_actor: float | None = None
    gpus_per_actor: float | None = None

    def __post_init__(self) -> None:
        if self.actors is not None and self.actors < 1:
            raise UsageError("--ray-actors must be at least 1")
        if self.cpus_per_actor is not None and not self.cpus_per_actor > 0:
            raise UsageError("--ray-cpus-per-actor must be > 0")
        if self.gpus_per_actor is not None and self.gpus_per_actor < 0:
            raise UsageError("--ray-gpus-per-actor must be >= 0")


@dataclass(frozen=True)
class ActorPlan:
    actors: int
    cpus: float  # Ray's CPU resource per actor
    gpus: float
    threads: int  # torch threads in each actor: its CPUs, in whole cores


def plan_resources(node_cpus: Sequence[float], gpus: float, device: str, asked: RayResources) -> ActorPlan:
    """Actors for the engine, from the alive nodes' CPUs and the cluster's GPUs.

    Decode tasks ask for no CPU, so whatever the actors hold, decoding can always be scheduled
    (actors holding every CPU otherwise starve it and the run hangs). On CPUs one actor per CPU,
    each with one torch thread, which captioned the benchmark corpus faster than fewer, wider
    actors (docs/benchmarks.md, *Ray*); each actor holds a model, so fewer, wider actors are the
    flag for memory. With GPUs (and ``--device``
    not cpu) one actor per GPU, the node's CPUs shared out between them."""
    if not node_cpus:
        raise FfaiError("the Ray cluster has no alive node")
    use_gpus = gpus > 0 and device != "cpu"
    if device == "cuda" and gpus == 0 and not asked.gpus_per_actor:
        raise UsageError("--device cuda: the Ray cluster has no GPU")
    gpus_per_actor = asked.gpus_per_actor if asked.gpus_per_actor is not None else (1.0 if use_gpus else 0.0)
    smallest = min(node_cpus)
    if asked.cpus_per_actor is not None:
        cpus = asked.cpus_per_actor
    elif gpus_per_actor:
        per_node = max(1, math.floor(gpus / len(node_cpus) / gpus_per_actor))
        cpus = max(1.0, math.floor(smallest / per_node))
    else:
        cpus = min(1.0, smallest)
    if cpus > max(node_cpus):
        raise UsageError(f"--ray-cpus-per-actor {cpus:g}: no node has that many CPUs (largest: {max(node_cpus):g})")
    if asked.actors is not None:
        actors = asked.actors
    elif gpus_per_actor:
        actors = max(1, math.floor(gpus / gpus_per_actor))
    else:
        actors = max(1, sum(math.floor(c / cpus) for c in node_cpus))
    return ActorPlan(actors=actors, cpus=cpus, gpus=gpus_per_actor, threads=max(1, math.ceil(cpus)))


def import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@dataclass
class _Input:
    job: int
    source: str
    started: float = field(default_factory=time.monotonic)
    attempt: int = 0
    generator: Any = None
    announced: bool = False  # "start" sent
    read: int = 0  # windows read from the current attempt's generator
    total: int | None = None  # windows in the input, once a generator has ended
    results: InOrder = field(default_factory=InOrder)  # each window's Cue or Failed, released in order
    finished: bool = False


class RayBackend:
    """A ``Backend`` (``ffai.run.input_events``) on a Ray cluster.

    ``address``: None or ``"auto"`` connects to ``$RAY_ADDRESS``, else to a cluster started on
    this machine with ``ray start --head``; ``"local"`` starts a Ray of our own (stopped on
    exit); anything else is a cluster's address. Entering connects, checks the model, starts the
    actors (each loads the weights) and raises an ``FfaiError`` if they cannot; leaving kills the
    actors and disconnects (stopping a Ray we started), also on Ctrl-C. ``ray_init`` adds
    arguments to ``ray.init`` for a local Ray (the tests cap its CPUs and object store)."""

    def __init__(
        self,
        options: CaptionOptions,
        address: str | None = None,
        resources: RayResources | None = None,
        *,
        ray_init: dict[str, Any] | None = None,
    ) -> None:
        self.options = options
        self.address = address or AUTO
        self.resources = resources or RayResources()
        self._ray_init = ray_init or {}
        self._ray = import_ray()
        # The cheap checks of a local run (engine, model folder, window against the context) and
        # its warnings, here.
        self.captioner = Captioner(options)
        self.engine_name = self.captioner.engine.info.name
        self.model_name = self.captioner.model_name
        self.plan: ActorPlan | None = None
        self.pool: ActorPool | None = None
        self._connected = False
        self._joined = False  # this process was connected to Ray before: leave it connected
        self._entered = 0
        self._decode_s = 0.0
        self._windows = 0
        # Decodes started again for inputs lost with a node (what faults cost, for the tests).
        self.inputs_redecoded = 0

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> RayBackend:
        # Entered again (a library caller who holds it up across runs), it stays up until the
        # outermost exit.
        self._entered += 1
        if self._entered > 1:
            return self
        try:
            self._connect()
            self._start_actors()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered -= 1
        if self._entered == 0:
            self.close()

    def close(self) -> None:
        ray = self._ray
        self._entered = 0
        if not self._connected:
            return
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self._connected = False
        if not self._joined:
            ray.shutdown()  # stops a local Ray we started; disconnects from any other

    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():  # a program that runs its own Ray driver and calls ffai in it
            self._joined = self._connected = True
            return
        quiet = dict(
            include_dashboard=False,
            log_to_driver=False,  # workers' stdout/stderr stay in Ray's log files
            logging_level=logging.ERROR,  # Ray's INFO lines and its token-auth WARNING
            configure_logging=True,
        )
        if self.address == LOCAL:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            args = {
                "object_store_memory": min(LOCAL_OBJECT_STORE_BYTES, memory // 10),
                # Ray runs workers at nice 15 so a cluster's daemons stay responsive; a Ray of our
                # own runs the engine as a local run would, not behind every other process here.
                "_system_config": {"worker_niceness": 0},
                **self._ray_init,
            }
            target = "local"
        else:
            args = {}
            target = (os.environ.get("RAY_ADDRESS") or "auto") if self.address == AUTO else self.address
            _check_reachable(target)
        try:
            with _native_stderr_silenced():
                ray.init(address=target, **quiet, **args)
        except (ConnectionError, RuntimeError, ValueError) as e:
            if self.address == AUTO and not os.environ.get("RAY_ADDRESS"):
                raise FfaiError(
                    "--ray: no Ray cluster to join (RAY_ADDRESS is not set and none runs on this machine); "
                    "start one with `ray start --head`, give --ray ADDRESS, or use --ray local"
                ) from e
            raise FfaiError(f"--ray: cannot join the Ray cluster at {target}: {' '.join(str(e).split())}") from e
        self._connected = True
        _silence_ray_loggers()

    def _node_cpus(self) -> list[float]:
        return [n["Resources"].get("CPU", 0.0) for n in self._ray.nodes() if n.get("Alive")]

    def _start_actors(self) -> None:
        gpus = self._ray.cluster_resources().get("GPU", 0.0)
        self.plan = plan_resources(self._node_cpus(), gpus, self.options.runtime.device, self.resources)
        asks = f"{self.plan.cpus:g} CPUs, {self.plan.gpus:g} GPUs each"
        per_actor = windows_per_actor(self.captioner.options.runtime.batch)
        self.pool = ActorPool(self._ray, self._new_actor, self.plan.actors, asks, per_actor)
        # The run starts with the first actor up; the others join as they finish loading.
        self.pool.start()

    def _new_actor(self) -> Any:
        ray, plan, c = self._ray, self.plan, self.captioner
        # The run's runtime as given, every field kept, with the actor's thread count filled in.
        runtime = replace(c.options.runtime, threads=c.options.runtime.threads or plan.threads)
        actor_class = ray.remote(EngineActor).options(
            num_cpus=plan.cpus,
            num_gpus=plan.gpus,
            max_concurrency=self.pool.per_actor,
            max_restarts=0,  # this driver replaces a dead actor and resends its windows itself
            scheduling_strategy="SPREAD",
        )
        model_dir = str(c.model_dir.absolute())  # the actors' working folder is not ours
        return actor_class.remote(list(c.engine.stages()), model_dir, runtime, plan.threads, self.pool.per_actor)

    def actors_working(self) -> int:
        """How many actors are up and hold windows right now (the node fault test waits for
        every actor to hold some before it removes a node)."""
        return self._started().working()

    def actor_pids(self) -> list[int]:
        """The actors' process ids (the fault tests kill one)."""
        return self._started().pids()

    @property
    def windows_resent(self) -> int:
        """Windows sent again to another actor after theirs died."""
        return self.pool.windows_resent if self.pool else 0

    @property
    def actors_replaced(self) -> int:
        return self.pool.actors_replaced if self.pool else 0

    def stage_rates(self) -> dict[str, tuple[float, int]]:
        """Seconds and windows per stage, summed over the actors still alive, and decoding's."""
        totals: dict[str, list[float]] = {"decode": [self._decode_s, self._windows]}
        for stats in self._started().stage_seconds():
            for name, (seconds, calls) in stats.items():
                total = totals.setdefault(name, [0.0, 0])
                total[0] += seconds
                total[1] += calls
        return {name: (seconds, int(calls)) for name, (seconds, calls) in totals.items()}

    def _started(self) -> ActorPool:
        if self.pool is None:
            raise FfaiError("the Ray backend is not started: use it in a with block")
        return self.pool

    # -- running --------------------------------------------------------------------------

    def run(self, inputs: Sequence[tuple[int, str]]) -> Iterator[InputEvent]:
        return _Run(self, inputs).events()


class _Run:
    """One call of ``RayBackend.run``: each input decoded by a task on the cluster (the window
    source, ``ffai.run.window_source.window_items``), its windows captioned by the actor pool (the
    runner) and its answers released in timeline order (``InOrder``), as in a local run. What is
    Ray's own: several inputs decode at once to keep every actor fed, and an input whose decode
    task or windows were lost with a node is decoded again, its answered windows skipped."""

    def __init__(self, backend: RayBackend, inputs: Sequence[tuple[int, str]]) -> None:
        self.backend = backend
        self.ray = backend._ray
        self.pool = backend._started()
        self.todo = deque(inputs)
        self.open: list[_Input] = []
        self.generators: dict[Any, tuple[_Input, int]] = {}  # decode task -> (input, attempt)
        self.in_flight = max(backend.options.max_in_flight, backend.pool.per_actor * backend.plan.actors)
        # Inputs decoding at once: enough to keep every actor fed, and no more (docs/benchmarks.md, *Ray*).
        self.max_open = backend.plan.actors + 1
        self.pool.begin(wanted=lambda tag: not tag[0].finished and tag[2] not in tag[0].results)
        self.options = backend.options
        self.decode = self.ray.remote(decode_input).options(
            num_cpus=0,
            num_returns="streaming",
            max_retries=0,
            scheduling_strategy="SPREAD",
            _generator_backpressure_num_objects=DECODE_AHEAD,
        )

    def events(self) -> Iterator[InputEvent]:
        try:
            while self.todo or self.open:
                while self.todo and len(self.open) < self.max_open:
                    job, source = self.todo.popleft()
                    if is_live(source) and not is_url(source):  # a URL is read where it is decoded
                        error = f"{source_label(source)}: stdin and pipes are read on this machine, not on Ray"
                        yield InputEvent(job, "failed", error=error, seconds=0.0)
                        continue
                    item = _Input(job, source)
                    self.open.append(item)
                    self._decode(item)
                interrupts.check()  # dropped generators' finalisers may have swallowed a Ctrl-C
                for ref in self._wait():
                    if self.pool.owns(ref):
                        for (item, attempt, index), outcome in self.pool.done(ref):
                            yield from self._answered(item, attempt, index, outcome)
                    elif ref in self.generators:
                        yield from self._read(*self.generators.pop(ref), ref)
                for item in [i for i in self.open if i.finished]:
                    self.open.remove(item)
        finally:
            # A Ray call after the backend closed would start a new local Ray (Ray's auto-init):
            # an events loop left unfinished may be collected only after Ctrl-C closed it.
            if self.backend._connected:
                for generator in [i.generator for i in self.open if i.generator is not None]:
                    try:
                        self.ray.cancel(generator)  # its windows are not wanted any more
                    except Exception:
                        pass

    def _decode(self, item: _Input) -> None:
        item.attempt += 1
        item.read = 0
        item.total = None  # counted again by this attempt's generator
        item.generator = self.decode.remote(item.source, self.options, os.getcwd())
        self.generators[item.generator] = (item, item.attempt)

    def _wait(self) -> list[Any]:
        # Decode tasks are read only while the windows between decoded and answered are fewer
        # than in_flight: the driver's memory does not grow with the corpus.
        reading = self.pool.in_flight < self.in_flight
        refs = [*self.pool.refs(), *(self.generators if reading else ())]
        if not refs:
            return []
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=0.5)
        return ready

    def _read(self, item: _Input, attempt: int, generator: Any) -> Iterator[InputEvent]:
        ray = self.ray
        if item.finished or attempt != item.attempt:
            return
        try:
            ref = next(generator)
        except StopIteration:
            item.total = item.read - 1  # the first object is the probe's
            yield from self._emit(item)
            return
        except ray.exceptions.RayError as e:
            yield from self._lost(item, e)
            return
        self.generators[generator] = (item, attempt)
        if item.read == 0 or ref == generator.completed():
            # The probe's answer, or the task's own end: an error when it failed (a node lost
            # mid-input), which is then its last object, not a window.
            item.read = max(item.read, 1)
            try:
                head = ray.get(ref)
            except ray.exceptions.RayError as e:
                if classify_fault(ray, e) == "failed":
                    yield self._fail(item, cause_line(e))
                else:
                    yield from self._lost(item, e)
                return
            if isinstance(head, Failed):
                yield self._fail(item, head.error)
            elif isinstance(head, MediaInfo) and not item.announced:
                item.announced = True
                yield InputEvent(item.job, "start", info=head)
            return
        index = item.read - 1
        item.read += 1
        if index not in item.results:
            self.pool.submit((item, attempt, index), ref)

    def _answered(self, item: _Input, attempt: int, index: int, outcome: Outcome) -> Iterator[InputEvent]:
        if isinstance(outcome, Lost):  # the window's object, or the task making it, is lost with its node
            if attempt == item.attempt and not item.finished:
                yield from self._lost(item, outcome.error)
            return
        if item.finished or index in item.results:
            return
        if isinstance(outcome, WindowResult):
            self.backend._decode_s += outcome.decode_s
            self.backend._windows += 1
            outcome = answered_cue(outcome.timing, outcome.answer)
        yield from self._emit(item, item.results.add(index, outcome))

    def _emit(self, item: _Input, due: Sequence[Any] = ()) -> Iterator[InputEvent]:
        """Events for the input's results now due in timeline order (cues, or a failure that
        ends it), then its end once every window is out."""
        for result in due:
            if item.finished:
                return
            if isinstance(result, Failed):
                yield self._fail(item, result.error)
                return
            yield InputEvent(item.job, "cue", cue=result)
        if item.total is not None and item.results.released >= item.total and not item.finished:
            item.finished = True
            yield InputEvent(item.job, "done", seconds=time.monotonic() - item.started)

    def _fail(self, item: _Input, error: str, transient: bool = False) -> InputEvent:
        item.finished = True
        seconds = time.monotonic() - item.started
        return InputEvent(item.job, "failed", error=error, transient=transient, seconds=seconds)

    def _lost(self, item: _Input, error: BaseException) -> Iterator[InputEvent]:
        """The input's decode task or its windows were lost: decode it again, or give up."""
        self.generators.pop(item.generator, None)
        if item.attempt >= MAX_ATTEMPTS:
            reason = " ".join(str(error).split())[:200]
            yield self._fail(item, f"{item.source}: lost on the Ray cluster: {reason}", transient=True)
            return
        self.backend.inputs_redecoded += 1
        self._decode(item)


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """While Ray connects, its C++ client logs to this process's stderr (a GCS that does not
    answer: a warning a second, whatever RAY_BACKEND_LOG_LEVEL says): file descriptor 2 goes to
    /dev/null meanwhile; a failure still ends in ffai's one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse at once, in one line, a cluster address nothing answers at: Ray itself retries
    for minutes. ``auto`` and addresses without a port are left to Ray."""
    host, _, port = address.rpartition("://")[2].rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise FfaiError(f"--ray: cannot reach the Ray cluster at {address} ({e.strerror or e})") from e


def _silence_ray_loggers() -> None:
    for name in ("ray", "ray.data", "ray.train", "ray.tune", "ray.serve"):
        logging.getLogger(name).setLevel(logging.ERROR)
