"""Toy stages and configs for the pipeline tests.

Factories are referenced as ``"<this module>:name"`` strings built from ``__name__``, so
the same configs work whatever package path pytest gives this folder; spawned workers
inherit the parent's ``sys.path`` and import this module by that name.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from ffai.pipeline import Message, PipelineConfig, ProcessConfig, Scheduler, StageConfig, StreamingScheduler, emit
from ffai.pipeline.messages import NEW_REQUEST


def ref(name: str) -> str:
    return f"{__name__}:{name}"


# -- split -> {upper, count} -> join, with a projection per branch --------------------------


def split(payload: dict[str, Any]) -> dict[str, Any]:
    text = payload["text"]
    return {"text": text, "words": text.split(), "delays": payload.get("delays", {}), "secret": "split only"}


def text_part(result: dict[str, Any]) -> dict[str, Any]:
    return {"text": result["text"], "delay": result["delays"].get("upper", 0)}


def words_part(result: dict[str, Any]) -> dict[str, Any]:
    return {"words": result["words"], "delay": result["delays"].get("count", 0)}


def upper(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(payload["delay"])
    if "boom" in payload["text"]:
        raise ValueError(f"cannot shout {payload['text']!r}")
    return {"seen": sorted(payload), "value": payload["text"].upper(), "pid": os.getpid()}


def count(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(payload["delay"])
    return {"seen": sorted(payload), "value": len(payload["words"]), "pid": os.getpid()}


def merge(parts: dict[str, Any]) -> dict[str, Any]:
    return {"upper": parts["upper"], "count": parts["count"], "order": list(parts)}


def identity(payload: Any) -> Any:
    return payload


def tagger(tag: str):
    """Factory: a stage answering ``(tag, payload)``."""
    return lambda payload: (tag, payload)


class Concurrent(Scheduler):
    """Runs every request on a thread of its own (sleeping ``payload["sleep"]``), so
    requests finish out of order; a scheduler written straight to the contract."""

    def handle(self, msg: Message) -> None:
        if msg.kind == NEW_REQUEST:
            threading.Thread(target=self._run, args=(msg.request_id, msg.data), daemon=True).start()

    def _run(self, request_id: Any, payload: dict[str, Any]) -> None:
        time.sleep(payload["sleep"])
        self.put_result(request_id, payload)


def make(fn_name: str):
    """Factory for a plain function stage: the function named ``fn_name`` here."""
    return globals()[fn_name]


def split_join_config() -> PipelineConfig:
    return PipelineConfig(
        stages=[
            StageConfig(
                "split",
                ref("make"),
                args=("split",),
                next=["upper", "count"],
                process="io",
                project_payload={"upper": ref("text_part"), "count": ref("words_part")},
            ),
            StageConfig("upper", ref("make"), args=("upper",), next="join"),
            StageConfig("count", ref("make"), args=("count",), next="join"),
            StageConfig(
                "join",
                ref("make"),
                args=("identity",),
                terminal=True,
                process="io",
                wait_for=["upper", "count"],
                merge_fn=ref("merge"),
            ),
        ]
    )


# -- batching ------------------------------------------------------------------------------


def batch(payloads: list[dict[str, Any]]) -> list[Any]:
    for p in payloads:
        if "hold" in p:
            Path(p["marker"]).write_text("running")
            time.sleep(p["hold"])
    n = len(payloads)
    return [ValueError(f"bad item {p['x']!r}") if p["x"] == "bad" else {"x": p["x"], "batch": n} for p in payloads]


def batch_config(wait_ms: float, when_idle: bool) -> PipelineConfig:
    stage = StageConfig(
        "batch",
        ref("make"),
        args=("batch",),
        terminal=True,
        max_batch_size=4,
        max_batch_wait_ms=wait_ms,
        batch_wait_when_idle=when_idle,
    )
    return PipelineConfig([stage])


# -- streaming -----------------------------------------------------------------------------


def produce(payload: dict[str, Any]) -> dict[str, Any]:
    log = payload.get("log")
    for i in range(payload["n"]):
        time.sleep(payload["gap"])
        emit(f"{payload['tag']}{i}")
        if log:
            with open(log, "a") as f:
                f.write(f"{i}\n")
    return {"n": payload["n"]}


class Shouter(StreamingScheduler):
    """Re-emits each chunk upper-cased as it arrives; answers with them all joined."""

    def on_chunk(self, request_id: Any, chunk: Any, state: Any) -> None:
        state.chunks.append(chunk)
        self.emit(request_id, chunk.upper())

    def on_finish(self, request_id: Any, payload: Any, state: Any) -> Any:
        return {"joined": "".join(state.chunks).upper(), "n": payload["n"]}


def stream_config() -> PipelineConfig:
    return PipelineConfig(
        stages=[
            StageConfig("producer", ref("make"), args=("produce",), next="consumer", stream_to="consumer"),
            StageConfig("consumer", ref("Shouter"), terminal=True),
        ]
    )


def producer_only_config() -> PipelineConfig:
    return PipelineConfig([StageConfig("producer", ref("make"), args=("produce",), terminal=True)])


# -- faults --------------------------------------------------------------------------------


def sleeper(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(payload.get("sleep", 0))
    return payload


def broken_factory() -> None:
    raise RuntimeError("no weights here: broken factory")


def hanging_factory() -> None:
    time.sleep(120)


def sleeper_config(**process_kwargs: Any) -> PipelineConfig:
    return PipelineConfig(
        stages=[
            StageConfig("front", ref("make"), args=("identity",), next="slow"),
            StageConfig("slow", ref("make"), args=("sleeper",), terminal=True),
        ],
        **process_kwargs,
    )


# -- tensors and threads -------------------------------------------------------------------


_PROCESS_STATE: dict[str, Any] = {}


def remember(model_dir: str, *, tag: str) -> None:
    """A process init: what a real one would use to load a model once per process."""
    _PROCESS_STATE.update(model_dir=model_dir, tag=tag, pid=os.getpid())


def scale(payload: dict[str, Any]) -> dict[str, Any]:
    import torch

    t = torch.arange(payload["n"], dtype=torch.float32) * payload["k"] + payload["base"]
    held = {k: payload[k] for k in ("hold", "marker") if k in payload}
    return {"t": t, "threads": {"make": torch.get_num_threads()}, "init": dict(_PROCESS_STATE), **held}


def double(payload: dict[str, Any]) -> dict[str, Any]:
    import torch

    if "hold" in payload:  # lets a test kill this worker mid-request
        Path(payload["marker"]).write_text("doubling")
        time.sleep(payload["hold"])
    return {**payload, "t": payload["t"] * 2, "threads": {**payload["threads"], "double": torch.get_num_threads()}}


def tensor_config() -> PipelineConfig:
    return PipelineConfig(
        stages=[
            StageConfig("make", ref("make"), args=("scale",), next="double", process="maker"),
            StageConfig("double", ref("make"), args=("double",), terminal=True, process="doubler"),
        ],
        processes=[
            ProcessConfig(
                "maker", threads=1, init=ref("remember"), init_args=("/models/toy",), init_kwargs={"tag": "m"}
            ),
            ProcessConfig("doubler", threads=2),
        ],
    )


def talking_factory():
    """A stage that says a note and a warning as it loads, and a warning per request."""
    from ffai import messages

    messages.note(f"loading in {os.getpid()}")
    messages.warn("a fallback while loading")

    def talk(payload: Any) -> Any:
        messages.warn(f"request {payload}")
        return payload

    return talk


def model_error_factory() -> None:
    from ffai.errors import ModelError

    raise ModelError("/m/model.safetensors: truncated")


# -- serial processes: stages taking turns ----------------------------------------------------


def timed(payload: dict[str, Any]) -> dict[str, Any]:
    """Sleeps a little and records when it ran: (start, end) appended to ``payload["ran"]``."""
    start = time.monotonic()
    time.sleep(0.15)
    return {"ran": [*payload["ran"], (start, time.monotonic())]}


def turns_config(serial: bool, factory: str = "make", args: tuple = ("timed",)) -> PipelineConfig:
    return PipelineConfig(
        stages=[
            StageConfig("first", ref(factory), args=args, next="second", process="one"),
            StageConfig("second", ref(factory), args=args, terminal=True, process="one"),
        ],
        processes=[ProcessConfig("one", serial=serial)],
    )


def thread_probe():
    """A stage that records which thread made it and which thread runs it: (factory's thread,
    function's thread) appended to ``payload["threads"]``, by name and ident."""
    here = threading.current_thread()
    made = (here.name, here.ident)

    def probe(payload: dict[str, Any]) -> dict[str, Any]:
        now = threading.current_thread()
        return {"threads": [*payload["threads"], (made, (now.name, now.ident))]}

    return probe
