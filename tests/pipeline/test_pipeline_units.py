"""Pipeline parts without worker processes: config validation, schedulers, routing, and
the coordinator's contract on the inline placement."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ffai.errors import FfaiError
from ffai.pipeline import (
    ConfigError,
    Coordinator,
    Message,
    PipelineConfig,
    PipelineError,
    PipelineStartError,
    RequestAborted,
    SimpleScheduler,
    StageConfig,
    StageError,
    emit,
    worker,
)
from ffai.pipeline.messages import ERROR, NEW_REQUEST, RESULT, STREAM

from . import toy_stages as toy

F = toy.ref("make")


def _stage(name: str, **kw: Any) -> StageConfig:
    return StageConfig(name, F, args=("identity",), **kw)


# -- config validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stages", "entry", "message"),
    [
        ([_stage("a", next="ghost")], None, "next names unknown stage 'ghost'"),
        ([_stage("a", next="b", terminal=True), _stage("b", terminal=True)], None, "both next= and terminal=True"),
        ([_stage("a")], None, "its result goes nowhere"),
        (
            [_stage("a", next="b"), _stage("b", terminal=True, wait_for="a")],
            None,
            "wait_for needs merge_fn",
        ),
        ([_stage("a", next="b"), _stage("b", next="a", terminal=False)], None, "no entry stage"),
        ([_stage("a", terminal=True), _stage("a", terminal=True)], None, "duplicate stage name 'a'"),
        ([_stage("a", terminal=True), _stage("b", terminal=True)], None, "several entry stages"),
        ([_stage("a", terminal=True)], "zzz", "entry stage 'zzz' is not a stage"),
        ([_stage("a", next="b"), _stage("b", next="c"), _stage("c", next="b")], None, "no terminal stage"),
        ([_stage("a", terminal=True, stream_to="ghost")], None, "stream_to names unknown stage 'ghost'"),
        (
            [_stage("a", next="b", project_payload={"c": toy.ref("text_part")}), _stage("b", terminal=True)],
            None,
            "project_payload names 'c', which is not in next",
        ),
        ([_stage("a", terminal=True, route_fn=toy.ref("identity"))], None, "route_fn needs next="),
        (
            [
                _stage("a", next="b"),
                _stage("c", terminal=True),
                _stage("b", terminal=True, wait_for="c", merge_fn=toy.ref("merge")),
            ],
            None,
            "waits for 'c', which does not send to it",
        ),
        ([StageConfig("a", "not a reference", terminal=True)], None, "'module:attr' string"),
    ],
)
def test_config_errors_are_clear(stages: list[StageConfig], entry: str | None, message: str) -> None:
    config = PipelineConfig(stages, entry=entry)
    with pytest.raises(ConfigError, match=message) as caught:
        Coordinator(config)  # validation happens here, before any worker could start
    assert isinstance(caught.value, FfaiError)


def test_lambdas_are_refused_across_processes_but_fine_inline() -> None:
    config = PipelineConfig(
        [
            StageConfig("a", F, args=("identity",), next="b", project_payload={"b": lambda r: r}),
            _stage("b", terminal=True),
        ]
    )
    with pytest.raises(ConfigError, match="cannot be sent to a worker process"):
        Coordinator(config)
    with Coordinator(config, placement="inline") as pipe:
        assert pipe.submit(1, "x").result(5) == "x"


# -- schedulers ----------------------------------------------------------------------------


class _Running:
    """A scheduler running on its own thread, as a stage would run it."""

    def __init__(self, scheduler: SimpleScheduler) -> None:
        self.s = scheduler
        self.thread = threading.Thread(target=scheduler.start, daemon=True)
        self.thread.start()

    def send(self, rid: Any, payload: Any) -> None:
        self.s.inbox.put(Message(NEW_REQUEST, rid, payload))

    def take(self, timeout: float = 5.0) -> Message:
        return self.s.outbox.get(timeout=timeout)

    def close(self) -> None:
        self.s.stop()
        self.thread.join(2)
        assert not self.thread.is_alive()


def test_batch_fn_fails_one_item_and_keeps_the_rest() -> None:
    def batch(payloads: list[int]) -> list[Any]:
        return [ValueError(f"odd {p}") if p % 2 else p * 10 for p in payloads]

    run = _Running(SimpleScheduler(batch_fn=batch, max_batch_size=4, max_batch_wait_ms=2000))
    for rid in range(4):  # a window is open from the second request on; 4 fills it
        run.send(rid, rid)
    out = {m.request_id: m for m in (run.take() for _ in range(4))}
    run.close()
    assert out[0].kind == RESULT and out[0].data == 0
    assert out[2].kind == RESULT and out[2].data == 20
    assert out[1].kind == ERROR and out[1].data.message == "ValueError: odd 1"
    assert out[3].kind == ERROR and "odd 3" in out[3].data.message


@pytest.mark.parametrize("when_idle", [False, True])
def test_lone_request_waits_the_window_only_when_asked(when_idle: bool) -> None:
    window_s = 0.6
    run = _Running(
        SimpleScheduler(
            batch_fn=lambda ps: [len(ps)] * len(ps),
            max_batch_size=4,
            max_batch_wait_ms=window_s * 1000,
            batch_wait_when_idle=when_idle,
        )
    )
    t0 = time.monotonic()
    run.send("lone", None)
    msg = run.take()
    waited = time.monotonic() - t0
    run.close()
    assert msg.data == 1
    if when_idle:
        assert waited >= window_s * 0.95
    else:
        assert waited < window_s / 2


def test_emit_streams_and_abort_stops_the_function() -> None:
    started, finished = threading.Event(), threading.Event()

    def fn(n: int) -> str:
        started.set()
        for i in range(n):
            emit(i)
            time.sleep(0.02)
        finished.set()
        return "done"

    run = _Running(SimpleScheduler(fn))
    run.send("a", 3)
    assert [run.take().data for _ in range(4)] == [0, 1, 2, "done"]
    started.clear()
    finished.clear()
    run.send("b", 10_000)
    assert started.wait(5) and run.take().kind == STREAM
    run.s.abort("b")
    time.sleep(0.2)
    run.close()
    assert not finished.is_set()  # emit raised RequestAborted inside fn
    leftovers = []
    while not run.s.outbox.empty():
        leftovers.append(run.s.outbox.get_nowait())
    assert all(m.kind == STREAM for m in leftovers)  # no result for the aborted request


def test_emit_outside_a_stage_function_is_an_error() -> None:
    with pytest.raises(PipelineError, match="only available inside"):
        emit("x")


def test_abort_drops_a_queued_request() -> None:
    gate = threading.Event()
    run = _Running(SimpleScheduler(lambda p: gate.wait(5) and p))
    run.send("busy", "b")
    run.send("queued", "q")
    run.s.abort("queued")
    gate.set()
    assert run.take().request_id == "busy"
    time.sleep(0.2)
    run.close()
    assert run.s.outbox.empty()


# -- routing, backpressure, completion order (inline: same code, no processes) --------------


def pick(result: dict[str, Any]) -> Any:
    return result["to"]


def test_route_fn_chooses_among_next_only() -> None:
    config = PipelineConfig(
        [
            StageConfig("router", F, args=("identity",), next=["left", "right"], route_fn=pick),
            StageConfig("left", toy.ref("tagger"), args=("left",), terminal=True),
            StageConfig("right", toy.ref("tagger"), args=("right",), terminal=True),
        ]
    )
    with Coordinator(config, placement="inline") as pipe:
        assert pipe.submit(1, {"to": "left"}).result(5) == ("left", {"to": "left"})
        assert pipe.submit(2, {"to": "right"}).result(5) == ("right", {"to": "right"})
        with pytest.raises(StageError, match="must choose among next") as caught:
            pipe.submit(3, {"to": "elsewhere"}).result(5)
        assert caught.value.stage == "router"


def test_submit_blocks_while_max_in_flight_are_in_flight() -> None:
    config = PipelineConfig([StageConfig("slow", F, args=("sleeper",), terminal=True)])
    with Coordinator(config, placement="inline", max_in_flight=2) as pipe:
        first = pipe.submit("a", {"sleep": 0.5})
        pipe.submit("b", {"sleep": 0.5})
        assert pipe.in_flight == 2
        with pytest.raises(PipelineError, match="no free slot"):
            pipe.submit("c", {}, timeout=0.1)
        third = pipe.submit("c", {})  # blocks until "a" finishes
        assert first.done()
        assert third.result(5) == {}
        pipe.submit("d", {"sleep": 0.3})
        with pytest.raises(PipelineError, match="already in flight"):
            pipe.submit("d", {})
    assert pipe.in_flight == 0


def test_as_completed_is_lazy_and_yields_in_completion_order() -> None:
    config = PipelineConfig([StageConfig("par", toy.ref("Concurrent"), terminal=True)])
    pulled: list[str] = []

    def requests():
        for rid, sleep in (("slow", 0.6), ("mid", 0.3), ("fast", 0.0), ("last", 0.0)):
            pulled.append(rid)
            yield rid, {"sleep": sleep}

    with Coordinator(config, placement="inline", max_in_flight=3) as pipe:
        order = []
        for future in pipe.as_completed(requests()):
            if not order:
                assert pulled == ["slow", "mid", "fast"]  # never more than 3 in flight
            order.append((future.request_id, future.result()["sleep"]))
    assert [rid for rid, _ in order] == ["fast", "last", "mid", "slow"]


def test_abort_fails_the_request_and_the_id_can_be_reused() -> None:
    config = PipelineConfig([StageConfig("slow", F, args=("sleeper",), terminal=True)])
    with Coordinator(config, placement="inline") as pipe:
        future = pipe.submit("r", {"sleep": 0.3})
        assert pipe.abort("r") and not pipe.abort("r")
        with pytest.raises(RequestAborted):
            future.result(1)
        assert pipe.submit("r", {"x": 1}).result(5) == {"x": 1}
        assert pipe.pending_state() == {"slow": {"waiting_fan_in": 0, "active": 0}}


def test_inline_factory_failure_raises_with_traceback() -> None:
    config = PipelineConfig([StageConfig("bad", toy.ref("broken_factory"), terminal=True)])
    with pytest.raises(PipelineStartError, match="no weights here") as caught:
        Coordinator(config, placement="inline").start()
    assert "Traceback" in str(caught.value)


def test_a_factory_ffai_error_travels_as_itself() -> None:
    from ffai.errors import ModelError

    config = PipelineConfig([StageConfig("bad", toy.ref("model_error_factory"), terminal=True)])
    with pytest.raises(ModelError) as caught:
        Coordinator(config, placement="inline").start()
    assert str(caught.value) == "/m/model.safetensors: truncated"


def test_an_unknown_placement_is_refused_before_anything_starts() -> None:
    config = PipelineConfig([StageConfig("a", F, args=("identity",), terminal=True)])
    with pytest.raises(PipelineError, match="placement must be one of inline, workers, got 'auto'"):
        Coordinator(config, placement="auto")


# -- the heap ------------------------------------------------------------------------------


def test_the_heap_is_trimmed_each_time_a_stage_function_returns(monkeypatch) -> None:
    # Stage functions stay pure computation: the pipeline hands the heap's free pages back after
    # each call, failed or not. Every placement builds its stages through make_scheduler.
    events: list[str] = []
    monkeypatch.setattr(worker, "release_free_heap", lambda: events.append("trim"))

    def stage(name: str):
        def run(payload: str) -> str:
            events.append(name)
            if payload == "fail":
                raise ValueError("this request fails")
            return payload

        return run

    config = PipelineConfig(
        [StageConfig("a", stage, args=("a",), next="b"), StageConfig("b", stage, args=("b",), terminal=True)]
    )
    with Coordinator(config, placement="inline") as pipe:
        assert pipe.submit(1, "x").result(5) == "x"
        assert events == ["a", "trim", "b", "trim"]
        with pytest.raises(StageError, match="this request fails"):
            pipe.submit(2, "fail").result(5)
    assert events[4:] == ["a", "trim"]
