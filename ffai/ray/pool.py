"""The engine's actors on a Ray cluster as one runner of the window path: windows in, outcomes out.

What the local pipeline's ``Coordinator`` is to this machine's processes, ``ActorPool`` is to Ray
actors: each actor (``ffai.ray.workers.EngineActor``) runs the engine's own stages with its
weights loaded once; the pool sends each window to the least busy ready actor, at most
``windows_per_actor`` each (its text stage's batch and one more), and gives back each window's
outcome. It owns the actors' faults: Ray runs each call at most once here (no restarts), a window
whose actor died goes to another actor, and a new actor replaces the dead one, a bounded number of
times per run. Which windows exist and
in what order their answers are released is the caller's (``ffai.ray.backend``), as it is the
local run's (``ffai.run.window_source``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ffai.errors import FfaiError
from ffai.ray.workers import Failed, WindowResult

ACTOR_IN_FLIGHT = 2  # windows per actor: one computing, one waiting, so an actor never idles


def windows_per_actor(batch: int) -> int:
    """Windows an actor holds at once: its text stage's batch and one more being prepared (at least
    ``ACTOR_IN_FLIGHT``), so each actor batches what it is sent."""
    return max(ACTOR_IN_FLIGHT, batch + 1)


START_TIMEOUT_S = 300.0  # for the first engine actor to load (a cluster may be adding a node)


@dataclass(frozen=True)
class Lost:
    """A window whose object, or the task making it, is gone with its node: the input it came
    from must be decoded again (no actor can answer it)."""

    error: BaseException


Outcome = WindowResult | Failed | Lost


@dataclass
class _Slot:
    """One actor of the pool (or its replacement, while it starts)."""

    actor: Any
    ready: bool = False
    busy: int = 0
    starting: Any = None  # its ready() call while it starts


class ActorPool:
    """``size`` engine actors made by ``new_actor()``; ``start()`` returns once the first one has
    loaded (the others join as they load) or raises an ``FfaiError`` if none can.

    A run calls ``begin(wanted)``, then ``submit(tag, window_ref)`` per decoded window, waits with
    ``ray.wait`` on ``refs()`` (with anything of its own) and passes each ready ref the pool
    ``owns`` to ``done``, which gives the ``(tag, outcome)`` pairs it settled. ``wanted(tag)``
    says whether a window still needs an answer: one that does not (its input ended or already
    has that window's answer) is never sent again."""

    def __init__(
        self, ray: Any, new_actor: Callable[[], Any], size: int, describe: str, per_actor: int = ACTOR_IN_FLIGHT
    ) -> None:
        self._ray = ray
        self.per_actor = per_actor  # windows sent to one actor at once
        self._new_actor = new_actor
        self._size = size
        self._describe = describe  # what each actor asks of the cluster, for the one-line error
        self._slots: list[_Slot] = []
        self._waiting: deque[tuple[Any, Any]] = deque()  # (tag, window ref) with no actor yet
        self._calls: dict[Any, tuple[Any, Any, _Slot, Any]] = {}  # answer ref -> (tag, window ref, slot, actor)
        self._starting: dict[Any, _Slot] = {}  # ready() ref -> its slot, while the actor loads
        self._wanted: Callable[[Any], bool] = lambda tag: True
        self._replacements = 0
        # What faults cost, for the tests and the curious.
        self.windows_resent = 0
        self.actors_replaced = 0

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._slots = [_Slot(self._new_actor()) for _ in range(self._size)]
        for slot in self._slots:
            slot.starting = slot.actor.ready.remote()
            self._starting[slot.starting] = slot
        # An actor the cluster has no room for waits for it (an autoscaler may add a node), but
        # not forever.
        deadline = time.monotonic() + START_TIMEOUT_S
        while not any(slot.ready for slot in self._slots):
            timeout = max(0.0, deadline - time.monotonic())
            ready, _ = self._ray.wait(list(self._starting), num_returns=1, timeout=timeout)
            if not ready:
                raise FfaiError(
                    f"--ray: no engine actor ({self._describe}) could start on the Ray cluster within "
                    f"{START_TIMEOUT_S:g} s; it may be full: see --ray-cpus-per-actor and --ray-actors"
                )
            self._loaded(ready[0], strict=True)

    def close(self) -> None:
        for slot in self._slots:
            try:
                self._ray.kill(slot.actor, no_restart=True)
            except Exception:  # already dead, or the cluster is gone: nothing left to stop
                pass
        self._slots = []
        self._starting.clear()
        self._calls.clear()
        self._waiting.clear()

    # -- what the actors do ---------------------------------------------------------------

    def working(self) -> int:
        """Actors up and holding windows right now."""
        return sum(1 for slot in self._slots if slot.ready and slot.busy > 0)

    def pids(self) -> list[int]:
        return [pid for pid, _ in self._ray.get([s.actor.ready.remote() for s in self._slots if s.ready])]

    def stage_seconds(self) -> Iterator[dict[str, tuple[float, int]]]:
        """Each live actor's seconds and calls per stage."""
        yield from self._ray.get([s.actor.stage_seconds.remote() for s in self._slots if s.ready])

    # -- running windows ------------------------------------------------------------------

    def begin(self, wanted: Callable[[Any], bool]) -> None:
        """A new run: nothing queued, and a fresh budget of replacement actors (a run that
        kills every actor it gets ends instead of replacing them forever)."""
        self._wanted = wanted
        self._waiting.clear()
        self._calls.clear()
        for slot in self._slots:
            slot.busy = 0
        self._replacements = 2 * len(self._slots) + 2

    @property
    def in_flight(self) -> int:
        """Windows submitted and not yet settled."""
        return len(self._waiting) + len(self._calls)

    def submit(self, tag: Any, window_ref: Any) -> None:
        self._waiting.append((tag, window_ref))
        self._dispatch()

    def refs(self) -> list[Any]:
        """What to wait on for the pool: answers owed and actors loading."""
        return [*self._calls, *self._starting]

    def owns(self, ref: Any) -> bool:
        return ref in self._calls or ref in self._starting

    def done(self, ref: Any) -> list[tuple[Any, Outcome]]:
        """Settle a ready ref from ``refs()``: the windows whose outcome is now known (none when
        it was an actor that loaded, or a window that went to another actor)."""
        if ref in self._starting:
            self._loaded(ref, strict=False)
            self._dispatch()
            return []
        tag, window_ref, slot, actor = self._calls.pop(ref)
        if slot.actor is actor:  # not an answer owed by an actor since replaced
            slot.busy -= 1
        ray = self._ray
        try:
            outcome: Outcome = ray.get(ref)
        except ray.exceptions.RayError as e:
            fault = classify_fault(ray, e)
            if fault == "actor":
                if slot.actor is actor:
                    self._replace(slot)
                if self._wanted(tag):
                    self.windows_resent += 1
                    self._waiting.appendleft((tag, window_ref))
                self._dispatch()
                return []
            outcome = Lost(e) if fault == "lost" else Failed(cause_line(e))
        self._dispatch()
        return [(tag, outcome)]

    def _dispatch(self) -> None:
        """Hand waiting windows to the least busy ready actors."""
        while self._waiting:
            ready = [s for s in self._slots if s.ready and s.busy < self.per_actor]
            if not ready:
                return
            slot = min(ready, key=lambda s: s.busy)
            tag, window_ref = self._waiting.popleft()
            if not self._wanted(tag):
                continue
            slot.busy += 1
            self._calls[slot.actor.caption.remote(window_ref)] = (tag, window_ref, slot, slot.actor)

    # -- faults ---------------------------------------------------------------------------

    def _replace(self, slot: _Slot) -> None:
        """Start a new actor in place of a dead one; it takes windows once it has loaded."""
        if not slot.ready:
            return  # already being replaced
        slot.ready = False
        slot.busy = 0
        self._restart(slot)

    def _restart(self, slot: _Slot) -> None:
        try:
            self._ray.kill(slot.actor, no_restart=True)  # unreachable, maybe not dead: it must not come back
        except Exception:
            pass
        if self._replacements == 0:
            if not any(s.ready for s in self._slots):
                raise FfaiError("every Ray actor running the engine died")
            return
        self._replacements -= 1
        self.actors_replaced += 1
        slot.actor = self._new_actor()
        slot.starting = slot.actor.ready.remote()
        self._starting[slot.starting] = slot

    def _loaded(self, ref: Any, *, strict: bool) -> None:
        """An actor answered its ``ready()`` (``ref``). At start (``strict``) its engine's load
        error is the run's; a replacement whose process or node died while it loaded is started
        again, and one whose engine refused is left out unless it was the last hope."""
        slot = self._starting.pop(ref)  # a slot's one pending ready(): restarts happen only after it settles
        slot.starting = None
        ray = self._ray
        try:
            _, error = ray.get(ref)
        except ray.exceptions.RayError:
            if strict:
                raise
            self._restart(slot)
            return
        if error is None:
            slot.ready = True
        elif strict:
            raise FfaiError(error)
        elif not any(s.ready for s in self._slots):
            raise FfaiError(f"a new Ray actor for the engine failed to start: {error}")


def classify_fault(ray: Any, error: BaseException) -> str:
    """What a Ray error means here: ``"actor"`` (the actor running the call died: send the
    window elsewhere), ``"lost"`` (a node, worker or object is gone: decode the input again) or
    ``"failed"`` (the code itself raised: the input fails, as it would locally)."""
    cause = getattr(error, "cause", None)
    if isinstance(error, ray.exceptions.RayActorError) or isinstance(cause, ray.exceptions.RayActorError):
        return "actor"
    if isinstance(error, ray.exceptions.RayTaskError) and not isinstance(cause, ray.exceptions.RayError):
        return "failed"
    return "lost"


def cause_line(error: Any) -> str:
    """The one-line reason of an exception raised in a task or an actor."""
    cause = getattr(error, "cause", None) or error
    if isinstance(cause, FfaiError):
        return " ".join(str(cause).split())
    return " ".join(f"{type(cause).__name__}: {cause}".split())
