"""The pipeline with real worker processes: SGLang-Omni's three experiments on toy stages,
faults (a failing stage, a killed worker, a failing factory, an abort mid-stream, a killed
parent), tensors through shared memory, and both placements of the same config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ffai.pipeline import (
    Coordinator,
    PipelineConfig,
    PipelineError,
    PipelineStartError,
    RequestAborted,
    StageConfig,
    StageError,
    WorkerDied,
)

from . import toy_stages as toy
from .checks import pid_gone, wait_until

RESULT_TIMEOUT = 30  # generous for a loaded 2-core machine; a hang still ends the test


def _zeroed(pipe: Coordinator) -> bool:
    return all(v == 0 for counts in pipe.pending_state().values() for v in counts.values())


@pytest.mark.parametrize("placement", ["workers", "inline"])
def test_split_join_projects_per_branch_and_keeps_requests_apart(placement, shm_clean, no_orphans) -> None:
    with Coordinator(toy.split_join_config(), placement=placement) as pipe:
        no_orphans.extend(pipe.worker_pids().values())
        # "a" finishes its count branch first, "b" its upper branch first.
        a = pipe.submit("a", {"text": "one two three", "delays": {"upper": 0.4}})
        b = pipe.submit("b", {"text": "four five", "delays": {"count": 0.4}})
        ra, rb = a.result(RESULT_TIMEOUT), b.result(RESULT_TIMEOUT)
    assert ra["upper"]["value"] == "ONE TWO THREE" and ra["count"]["value"] == 3
    assert rb["upper"]["value"] == "FOUR FIVE" and rb["count"]["value"] == 2
    # Each branch saw only its projection, never the split stage's other fields.
    assert ra["upper"]["seen"] == rb["upper"]["seen"] == ["delay", "text"]
    assert ra["count"]["seen"] == rb["count"]["seen"] == ["delay", "words"]
    # Parts are keyed by source, not arrival order.
    assert ra["order"] == rb["order"] == ["upper", "count"]
    if placement == "inline":
        assert ra["upper"]["pid"] == ra["count"]["pid"] == os.getpid()
    else:
        assert len({ra["upper"]["pid"], ra["count"]["pid"], os.getpid()}) == 3


@pytest.mark.parametrize("when_idle", [False, True], ids=["run-at-once", "wait-when-idle"])
def test_batching_window(when_idle, tmp_path, no_orphans) -> None:
    window_s = 1.2
    with Coordinator(toy.batch_config(window_s * 1000, when_idle), max_in_flight=8) as pipe:
        no_orphans.extend(pipe.worker_pids().values())
        t0 = time.monotonic()
        lone = pipe.submit("lone", {"x": "lone"}).result(RESULT_TIMEOUT)
        waited = time.monotonic() - t0
        assert lone == {"x": "lone", "batch": 1}
        if when_idle:
            assert waited >= window_s * 0.95
        else:
            assert waited < window_s * 0.75

        # Hold the stage busy, then send four at once: they queue up and run as one batch.
        marker = tmp_path / "holding"
        blocker = pipe.submit("blocker", {"x": "blocker", "hold": 1.5, "marker": str(marker)})
        assert wait_until(marker.exists, RESULT_TIMEOUT)
        futures = {x: pipe.submit(x, {"x": x}) for x in ("p", "q", "bad", "r")}
        assert blocker.result(RESULT_TIMEOUT) == {"x": "blocker", "batch": 1}
        for x in ("p", "q", "r"):
            assert futures[x].result(RESULT_TIMEOUT) == {"x": x, "batch": 4}
        with pytest.raises(StageError, match="bad item 'bad'"):
            futures["bad"].result(RESULT_TIMEOUT)


@pytest.mark.parametrize("placement", ["workers", "inline"])
def test_streaming_producer_to_consumer(placement, no_orphans) -> None:
    with Coordinator(toy.stream_config(), placement=placement) as pipe:
        no_orphans.extend(pipe.worker_pids().values())
        first = pipe.stream("s1", {"tag": "a", "n": 5, "gap": 0.12})
        second = pipe.stream("s2", {"tag": "b", "n": 3, "gap": 0.05})
        seen = []
        for chunk in first:
            seen.append((chunk, time.monotonic()))
        result = first.result(RESULT_TIMEOUT)
        finished = time.monotonic()
        assert [c for c, _ in seen] == ["A0", "A1", "A2", "A3", "A4"]
        assert result == {"joined": "A0A1A2A3A4", "n": 5}
        # The consumer passed chunks on while the producer was still working.
        assert seen[0][1] < seen[-1][1] - 0.25 and seen[-1][1] <= finished
        assert list(second) == ["B0", "B1", "B2"]
        assert second.result(RESULT_TIMEOUT) == {"joined": "B0B1B2", "n": 3}


def test_stage_error_fails_only_its_request(no_orphans) -> None:
    with Coordinator(toy.split_join_config()) as pipe:
        no_orphans.extend(pipe.worker_pids().values())
        good = [pipe.submit(i, {"text": f"fine {i}", "delays": {"upper": 0.1}}) for i in range(2)]
        # The count branch of the failing request reaches join; abort must free it there.
        bad = pipe.submit("bad", {"text": "boom box", "delays": {"upper": 0.3}})
        with pytest.raises(StageError) as caught:
            bad.result(RESULT_TIMEOUT)
        assert caught.value.stage == "upper" and caught.value.request_id == "bad"
        assert "ValueError: cannot shout 'boom box'" in str(caught.value)
        assert "Traceback" in caught.value.traceback
        assert [f.result(RESULT_TIMEOUT)["count"]["value"] for f in good] == [2, 2]
        assert wait_until(lambda: _zeroed(pipe), 10, interval=0.2), pipe.pending_state()
        assert pipe.in_flight == 0


def test_killed_worker_fails_pending_requests_and_shuts_down(shm_clean, no_orphans) -> None:
    pipe = Coordinator(toy.sleeper_config()).start()
    pids = pipe.worker_pids()
    no_orphans.extend(pids.values())
    try:
        futures = [pipe.submit(i, {"sleep": 60}) for i in range(3)]
        time.sleep(0.3)
        os.kill(pids["slow"], signal.SIGKILL)
        killed = time.monotonic()
        for future in futures:
            with pytest.raises(WorkerDied, match="'slow'"):
                future.result(timeout=5)
        assert time.monotonic() - killed < 5
        with pytest.raises(WorkerDied):
            pipe.submit("late", {})
    finally:
        t0 = time.monotonic()
        pipe.close()
    assert time.monotonic() - t0 < 10
    assert all(pid_gone(pid) for pid in pids.values())


def test_factory_failure_aborts_start_with_child_traceback(shm_clean, no_orphans) -> None:
    config = PipelineConfig(
        [
            StageConfig("ok", toy.ref("make"), args=("identity",), next="bad"),
            StageConfig("bad", toy.ref("broken_factory"), terminal=True),
        ]
    )
    pipe = Coordinator(config, start_timeout=RESULT_TIMEOUT)
    with pytest.raises(PipelineStartError) as caught:
        pipe.start()
    message = str(caught.value)
    assert "worker 'bad' failed to start" in message
    assert "Traceback" in message and "RuntimeError: no weights here: broken factory" in message
    pids = pipe.worker_pids()
    no_orphans.extend(pids.values())
    assert set(pids) == {"ok", "bad"} and all(pid_gone(pid) for pid in pids.values())
    with pytest.raises(PipelineError):
        pipe.submit("x", {})


def test_worker_that_never_reports_ready_times_out_and_is_stopped(shm_clean, no_orphans) -> None:
    config = PipelineConfig(
        [
            StageConfig("ok", toy.ref("make"), args=("identity",), next="stuck"),
            StageConfig("stuck", toy.ref("hanging_factory"), terminal=True),
        ]
    )
    pipe = Coordinator(config, start_timeout=3, stop_timeout=1)
    with pytest.raises(PipelineStartError, match=r"'stuck' did not report ready within 3 s"):
        pipe.start()
    pids = pipe.worker_pids()
    no_orphans.extend(pids.values())
    assert all(pid_gone(pid) for pid in pids.values())


def test_abort_mid_stream_stops_the_producer(tmp_path, no_orphans) -> None:
    log = tmp_path / "emitted.txt"
    with Coordinator(toy.producer_only_config()) as pipe:
        no_orphans.extend(pipe.worker_pids().values())
        stream = pipe.stream("s", {"tag": "c", "n": 400, "gap": 0.02, "log": str(log)})
        got = [next(stream) for _ in range(3)]
        stream.close()
        assert got == ["c0", "c1", "c2"]
        assert list(stream) == []  # no more chunks reach the caller
        with pytest.raises(RequestAborted):
            stream.result(1)
        time.sleep(0.5)
        emitted = log.read_text().count("\n")
        time.sleep(0.5)
        # The producer's emit() raised once the abort arrived: it stopped emitting.
        assert log.read_text().count("\n") == emitted < 100
        assert wait_until(lambda: _zeroed(pipe), 10, interval=0.2)


PARENT_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from ffai.pipeline import Coordinator
    from {module} import sleeper_config

    if __name__ == "__main__":
        pipe = Coordinator(sleeper_config()).start()
        pipe.submit("r", {{"sleep": 120}})
        print(json.dumps(pipe.worker_pids()), flush=True)
        time.sleep(120)
    """
)


def test_workers_exit_when_the_parent_is_killed(no_orphans) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    script = PARENT_SCRIPT.format(module=toy.__name__)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(parent.stdout.readline()), daemon=True)
        reader.start()
        reader.join(RESULT_TIMEOUT * 2)
        assert line and line[0].strip(), "the parent script did not start its pipeline"
        pids = json.loads(line[0])
        no_orphans.extend(pids.values())
        assert set(pids) == {"front", "slow"} and not any(pid_gone(p) for p in pids.values())
    finally:
        parent.kill()
        parent.wait(10)
    killed = time.monotonic()
    assert wait_until(lambda: all(pid_gone(p) for p in pids.values()), 5)
    assert time.monotonic() - killed < 5


def test_tensors_cross_processes_through_shared_memory(tmp_path, shm_clean, no_orphans) -> None:
    import torch

    n = 1 << 18  # 1 MiB of float32 each way
    base = torch.full((n,), 0.5)
    with Coordinator(toy.tensor_config()) as pipe:
        pids = pipe.worker_pids()
        no_orphans.extend(pids.values())
        futures = [pipe.submit(k, {"n": n, "k": float(k), "base": base}) for k in (1, 3)]
        results = [f.result(RESULT_TIMEOUT) for f in futures]
        for k, result in zip((1, 3), results):
            expected = (torch.arange(n, dtype=torch.float32) * k + 0.5) * 2
            assert torch.equal(result["t"], expected)
            assert result["t"].is_shared()  # it came back through shared memory
            # Thread counts come from each process's config, set before its stage was built.
            assert result["threads"] == {"make": 1, "double": 2}
            assert result["init"] == {"model_dir": "/models/toy", "tag": "m", "pid": pids["maker"]}
        del results, futures

        # Now kill a worker while tensors are in flight: /dev/shm must still end up clean.
        marker = tmp_path / "doubling"
        held = {"n": n, "k": 1.0, "base": base, "hold": 60, "marker": str(marker)}
        futures = [pipe.submit(i, held) for i in range(3)]
        assert wait_until(marker.exists, RESULT_TIMEOUT)
        os.kill(pids["doubler"], signal.SIGKILL)
        for future in futures:
            with pytest.raises(WorkerDied, match="'doubler'"):
                future.result(timeout=5)


@pytest.mark.parametrize("placement", ["workers", "inline"])
def test_what_a_stage_says_reaches_the_callers_messages(placement, no_orphans) -> None:
    """Notes and warnings said through ffai.messages in a worker, while loading and per request,
    are said again in the caller's process, in order, as the inline placement says them."""
    from ffai import messages

    config = PipelineConfig([StageConfig("talk", toy.ref("talking_factory"), terminal=True)])
    with messages.collect() as said:
        with Coordinator(config, placement=placement, start_timeout=RESULT_TIMEOUT) as pipe:
            pids = list(pipe.worker_pids().values()) or [os.getpid()]  # inline: no workers
            no_orphans.extend(pipe.worker_pids().values())
            assert pipe.submit(1, 7).result(RESULT_TIMEOUT) == 7
            assert wait_until(lambda: len(said) == 3, RESULT_TIMEOUT)
    assert len(pids) == 1 and (pids[0] != os.getpid()) is (placement == "workers")
    assert [m.level for m in said] == ["note", "warning", "warning"]
    assert said[0].text == f"loading in {pids[0]}"
    assert [m.text for m in said[1:]] == ["a fallback while loading", "request 7"]


def test_a_worker_ffai_error_travels_as_itself(shm_clean, no_orphans) -> None:
    from ffai.errors import ModelError

    config = PipelineConfig([StageConfig("bad", toy.ref("model_error_factory"), terminal=True)])
    pipe = Coordinator(config, start_timeout=RESULT_TIMEOUT)
    with pytest.raises(ModelError) as caught:
        pipe.start()
    assert str(caught.value) == "/m/model.safetensors: truncated"
    assert any("Traceback" in note for note in getattr(caught.value, "__notes__", []))
    no_orphans.extend(pipe.worker_pids().values())


@pytest.mark.parametrize("placement", ["workers", "inline"])
@pytest.mark.parametrize("serial", [True, False], ids=["serial", "side-by-side"])
def test_a_serial_process_runs_one_stage_at_a_time(placement, serial, no_orphans) -> None:
    with Coordinator(toy.turns_config(serial), placement=placement, max_in_flight=4) as pipe:
        no_orphans.extend(pipe.worker_pids().values())
        futures = [pipe.submit(i, {"ran": []}) for i in range(4)]
        runs = sorted(run for f in futures for run in f.result(RESULT_TIMEOUT)["ran"])
    assert len(runs) == 8
    overlaps = [(a, b) for a, b in zip(runs, runs[1:]) if b[0] < a[1]]
    # Side by side, the second stage works on one request while the first takes the next.
    assert not overlaps if serial else overlaps


@pytest.mark.parametrize("placement", ["workers", "inline"])
@pytest.mark.parametrize("serial", [True, False], ids=["serial", "side-by-side"])
def test_stages_load_and_compute_off_the_hosting_thread(placement, serial, no_orphans) -> None:
    """OpenMP gives each thread that runs parallel work a pool of its own (ffai.pipeline.compute):
    stages that take turns are made and run on one thread; stages side by side are made on a
    thread that then ends, never on the thread hosting the pipeline."""
    config = toy.turns_config(serial, factory="thread_probe", args=())
    with Coordinator(config, placement=placement) as pipe:
        no_orphans.extend(pipe.worker_pids().values())
        (first, second) = pipe.submit(0, {"threads": []}).result(RESULT_TIMEOUT)["threads"]
    made = {first[0], second[0]}
    ran = {first[1], second[1]}
    names = {name for name, _ in made | ran}
    assert "MainThread" not in names
    if serial:
        assert made == ran and len(ran) == 1
        assert names.pop().endswith("-compute")
    else:
        assert len(ran) == 2 and not made & ran
        assert all(name.endswith("-load") for name, _ in made)
