"""Windows decoded together (``ffai.kit.batched_decode``, the text stage's batch, the pipeline's
continuous scheduler): every window's tokens are those it gets decoded alone, in every dtype and
both families, whichever windows share its steps, wherever it joins and however it ends.

A decode step of several rows computes each row as it would be alone (the linears' row count
picks no other kernel), which the first test holds bit for bit; the rest follow from it and are
checked on whole answers."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch

from ffai.bench import cases
from ffai.engines import registry
from ffai.engines.contract import Answer, DecodingOptions, RuntimeOptions
from ffai.errors import EngineError
from ffai.kit.batched_decode import DecodeBatch
from ffai.kit.generate import Prompt, decode_one_token, generate, prefill
from ffai.kit.stages import BatchedTextDecoder
from ffai.pipeline.messages import NEW_REQUEST, RESULT, Message
from ffai.pipeline.scheduler import ContinuousScheduler, ContinuousWrapper
from ffai.run.inline import InlineEngine

ENGINES = ("smolvlm", "qwen3-vl")
DTYPES = ("float32", "int8", "bfloat16")


@pytest.fixture(scope="module", params=[(e, d) for e in ENGINES for d in DTYPES], ids=lambda p: f"{p[0]}-{p[1]}")
def model(request, tiny_checkpoint, qwen3vl_tiny):
    """(the inline engine, its text stage's model, the prompts of three windows: a frame, a still
    and a window of several frames, each the engine's own with its positions and injections)."""
    name, dtype = request.param
    folder = tiny_checkpoint if name == "smolvlm" else qwen3vl_tiny
    engine = InlineEngine(registry.get_engine(name), folder, RuntimeOptions(dtype=dtype, device="cpu"))
    net = engine["text"].net
    options = DecodingOptions(max_new_tokens=8)
    with torch.inference_mode():
        encoded = [engine.through(item.request(options), "vision") for item in _items()]
        prompts = [net.prompt(e) for e in encoded]
    return engine, net, prompts, encoded


def _items():
    return [*cases.items("frame"), *cases.items("still"), *cases.items("window")]


def alone(net, prompt: Prompt, options: DecodingOptions, stop_ids=()) -> list[int]:
    with torch.inference_mode():
        return generate(net.text, prompt, options, stop_ids)


def test_a_row_of_a_step_is_the_row_alone_bit_for_bit(model):
    _, net, prompts, _ = model
    text = net.text
    with torch.inference_mode():
        caches = [(text.new_cache(1, p.length + 8), text.new_cache(1, p.length + 8)) for p in prompts]
        logits = []
        for p, (one, many) in zip(prompts, caches):
            logits.append(prefill(text, p, one))
            prefill(text, p, many)
        for step in range(4):
            tokens = torch.cat([lg.argmax(-1) for lg in logits])
            rows = [(many, p.length + step, p.length + step + p.delta) for p, (_, many) in zip(prompts, caches)]
            together = text.decode_rows(tokens, rows)
            for i, (p, (one, _)) in enumerate(zip(prompts, caches)):
                logits[i] = decode_one_token(text, tokens[i : i + 1], p.length + step, p.length + step + p.delta, one)
                assert torch.equal(together[i : i + 1], logits[i]), (step, i)


def test_rows_that_end_at_different_steps_and_join_mid_way(model):
    """Three windows with their own lengths: one joins at once, one after two steps, one after
    four; each leaves the moment it ends (a stop id or its max_new_tokens)."""
    _, net, prompts, _ = model
    stop_ids = (0, 1, 2)
    wanted = [
        DecodingOptions(max_new_tokens=3, force_new_tokens=True),
        DecodingOptions(max_new_tokens=9),
        DecodingOptions(max_new_tokens=5, force_new_tokens=True),
    ]
    expected = [alone(net, p, o, stop_ids) for p, o in zip(prompts, wanted)]
    batch = DecodeBatch(net.text, stop_ids)
    got, ended_at, step = {}, {}, 0
    joins = {0: [0], 2: [1], 4: [2]}
    with torch.inference_mode():
        while len(got) < 3:
            for i in joins.get(step, []):
                done = batch.join(i, prompts[i], wanted[i])
                if done is not None:
                    got[i], ended_at[i] = done, step
            for key, tokens in batch.step():
                got[key], ended_at[key] = tokens, step
            step += 1
    assert [got[i] for i in range(3)] == expected
    # The first left after its third token, before the last had joined; the others decoded on.
    assert ended_at[0] == 1 < ended_at[2] and len(batch) == 0


def test_sampled_rows_keep_their_own_generators(model):
    _, net, prompts, _ = model
    wanted = [DecodingOptions(max_new_tokens=6, temperature=0.9, top_k=50, seed=s) for s in (1, 2, 3)]
    batch = DecodeBatch(net.text, ())
    got = {}
    with torch.inference_mode():
        for i, (p, o) in enumerate(zip(prompts, wanted)):
            assert batch.join(i, p, o) is None
        while len(batch):
            got.update(batch.step())
    assert [got[i] for i in range(3)] == [alone(net, p, o) for p, o in zip(prompts, wanted)]


def test_a_prompt_that_cannot_be_decoded_fails_alone(model):
    _, net, prompts, _ = model
    options = DecodingOptions(max_new_tokens=4, force_new_tokens=True)
    batch = DecodeBatch(net.text, ())
    with torch.inference_mode():
        assert batch.join("a", prompts[0], options) is None
        too_long = DecodingOptions(max_new_tokens=net.text.cfg.max_position_embeddings)
        with pytest.raises(EngineError, match="exceeds the model's context"):
            batch.join("b", prompts[1], too_long)
        assert batch.join("c", prompts[2], options) is None
        batch.drop("c")  # aborted: gone, the others unaffected
        got = {}
        while len(batch):
            got.update(batch.step())
    assert got == {"a": alone(net, prompts[0], options)}


def test_the_stage_streams_each_window_its_own_pieces(model):
    engine, net, _, encoded = model
    stage = BatchedTextDecoder(net, engine["text"].prompts, max_active=3)
    pieces: dict[int, list[str]] = {i: [] for i in range(3)}
    answers: dict[int, Answer] = {}
    for i, e in enumerate(encoded):
        assert stage.join(i, e, on_text=pieces[i].append) is None
    while stage.active():
        answers.update(stage.step())
    for i, e in enumerate(encoded):
        assert answers[i] == engine["text"](e)
        assert "".join(pieces[i]) == answers[i].text


class _Watched(ContinuousWrapper):
    """The stage, with the most windows it ever decoded in one step noted."""

    def __init__(self, stage) -> None:
        super().__init__(stage)
        self.most = 0

    def step(self):
        self.most = max(self.most, self.stage.active())
        return self.stage.step()


def test_the_scheduler_batches_what_waits_and_answers_each_as_it_ends(model):
    engine, net, _, encoded = model
    watched = _Watched(BatchedTextDecoder(net, engine["text"].prompts, max_active=2))
    scheduler = ContinuousScheduler(watched)
    thread = threading.Thread(target=scheduler.start, daemon=True)
    for i, e in enumerate(encoded):
        scheduler.inbox.put(Message(NEW_REQUEST, i, e))
    thread.start()
    results = {}
    deadline = time.monotonic() + 120
    while len(results) < 3 and time.monotonic() < deadline:
        msg = scheduler.outbox.get(timeout=120)
        assert msg.kind == RESULT, msg
        results[msg.request_id] = msg.data
    scheduler.stop()
    thread.join(5)
    assert results == {i: engine["text"](e) for i, e in enumerate(encoded)}
    assert watched.most == 2  # never more than max_active, and two did share steps


def _serve(stage, encoded) -> dict:
    scheduler = ContinuousScheduler(stage)
    for i, e in enumerate(encoded):
        scheduler.inbox.put(Message(NEW_REQUEST, i, e))
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    results = {}
    while len(results) < len(encoded):
        msg = scheduler.outbox.get(timeout=120)
        assert msg.kind == RESULT, msg
        results[msg.request_id] = msg.data
    scheduler.stop()
    thread.join(5)
    return results


def test_a_window_whose_cache_would_not_fit_waits_for_room(model, monkeypatch):
    """With free memory for no new cache, a window joins others only on a cache one of them left
    (each still answered as alone); with room, the same windows share steps."""
    from ffai.kit import batched_decode, host

    engine, net, _, encoded = model
    if engine.runtime.dtype != "float32":
        pytest.skip("the rule is the caches', the same in every dtype: float32 of each family holds it")
    alone_answers = {i: engine["text"](e) for i, e in enumerate(encoded)}
    monkeypatch.setattr(host, "available_memory", lambda device="cpu": batched_decode.RESERVE_BYTES + 1)
    cramped = _Watched(BatchedTextDecoder(net, engine["text"].prompts, max_active=3))
    allocated_beside = []  # how many windows were decoding when each new cache was made
    new_cache = net.text.new_cache
    monkeypatch.setattr(net.text, "new_cache", lambda *a: allocated_beside.append(cramped.active()) or new_cache(*a))
    assert _serve(cramped, encoded) == alone_answers
    assert allocated_beside and set(allocated_beside) == {0}
    monkeypatch.undo()
    monkeypatch.setattr(host, "available_memory", lambda device="cpu": None)  # cannot tell: no cap
    roomy = _Watched(BatchedTextDecoder(net, engine["text"].prompts, max_active=3))
    assert _serve(roomy, encoded) == alone_answers
    assert roomy.most > 1


def test_a_window_aborted_mid_decode_leaves_the_batch(model):
    engine, net, _, encoded = model
    stage = BatchedTextDecoder(net, engine["text"].prompts, max_active=3)
    scheduler = ContinuousScheduler(stage)
    options = DecodingOptions(max_new_tokens=300, force_new_tokens=True)
    for i, e in enumerate(encoded):
        scheduler.inbox.put(Message(NEW_REQUEST, i, dataclasses.replace(e, options=options)))
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while stage.active() < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    scheduler.abort(1)
    got = {}
    while len(got) < 2:
        msg = scheduler.outbox.get(timeout=120)
        assert msg.kind == RESULT, msg
        got[msg.request_id] = msg.data
    scheduler.stop()
    thread.join(5)
    assert sorted(got) == [0, 2] and stage.active() == 0 and scheduler.outbox.empty()
