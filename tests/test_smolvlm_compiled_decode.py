"""int8's compiled decode step (engines/smolvlm/compiled_decode.py) on the tiny checkpoint: the
same tokens as the eager step, greedy and sampled; a fresh load, with torch's in-memory compile
state cleared, reuses the compiled artifacts on disk (inductor's cache hit, no file added to the
cache folder, no compile note) and keeps one graph for a longer cache; a cache folder that cannot
be written leaves the eager step with one warning; loading attaches the step only where
FFAI_COMPILE_DECODE=1 asks.

The compile is paid once, by a module fixture, with inductor compiling in this process: its
worker processes cost more to start than the tiny graph costs to compile.

The tiny tower's two layers are among those the int8 plan keeps wider, so the model here is
loaded with every text linear int8 by row (the LM head on fbgemm), the layers the step compiles."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from ffai import messages
from ffai.engine import DecodingOptions, RuntimeOptions
from ffai_smolvlm import compiled_decode
from ffai_smolvlm.generate import generate
from ffai_smolvlm.loading import load_weights
from ffai_smolvlm.precision import INT8, INT8_BY_ROW, plan_precision
from ffai_smolvlm.weights import load_model, weight_files

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [1, 11126, 42, 7, 900, 31, 2000, 5, 77, 12, 300]
GREEDY = DecodingOptions(max_new_tokens=12, force_new_tokens=True)
SAMPLED = DecodingOptions(max_new_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=3, force_new_tokens=True)


def load(path: Path, *, compiled: bool):
    plan = dataclasses.replace(plan_precision("int8", "cpu"), linears=((r"text\.lm_head$", INT8), (r".", INT8_BY_ROW)))
    net = load_model(path, plan, parts=("text",))
    if compiled:
        compiled_decode.attach(net.text, weight_files(path), "int8")
    return net


def tokens(path: Path, *options: DecodingOptions, compiled: bool) -> list[list[int]]:
    """The tokens of one load for each of ``options``, in order."""
    net = load(path, compiled=compiled)
    with torch.inference_mode():
        return [generate(net, PROMPT, None, o, stop_ids=[]) for o in options]


@pytest.fixture(scope="module")
def compiled_home(tmp_path_factory, tiny_checkpoint):
    """An FFAI_HOME whose cache holds the tiny checkpoint's compiled step, and that step's tokens."""
    home = tmp_path_factory.mktemp("ffai-home")
    with pytest.MonkeyPatch.context() as mp, torch._inductor.config.patch(compile_threads=1):
        mp.setenv("FFAI_HOME", str(home))
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(home / "elsewhere"))  # restored after the module
        with messages.collect() as said:
            greedy, sampled = tokens(tiny_checkpoint, GREEDY, SAMPLED, compiled=True)
    return home, greedy, sampled, said


@pytest.mark.slow  # the compile: one layer's graph through inductor and the C++ compiler
def test_compiled_step_gives_the_eager_tokens(compiled_home, tiny_checkpoint):
    home, greedy, sampled, said = compiled_home
    assert [m.level for m in said] == ["note"] and "compiling the int8 decode step" in said[0].text
    assert [greedy, sampled] == tokens(tiny_checkpoint, GREEDY, SAMPLED, compiled=False)
    assert len(set(greedy)) > 1  # not one token repeated: the steps differ


@pytest.mark.slow
def test_a_fresh_load_reuses_the_compiled_step_and_a_longer_cache_its_graph(
    compiled_home, tiny_checkpoint, monkeypatch
):
    home, greedy, _, _ = compiled_home
    (folder,) = (home / "compiled").iterdir()
    assert (folder / compiled_decode.MARKER).is_file()
    before = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    monkeypatch.setenv("FFAI_HOME", str(home))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(home / "elsewhere"))  # the step sets it; restored after
    torch._dynamo.reset()  # a new process's state: nothing traced or compiled in memory
    counters = torch._dynamo.utils.counters
    hits = counters["inductor"]["fxgraph_cache_hit"]
    net = load(tiny_checkpoint, compiled=True)
    long = DecodingOptions(max_new_tokens=300, force_new_tokens=True)
    with messages.collect() as said, torch.inference_mode(), torch._inductor.config.patch(compile_threads=1):
        assert generate(net, PROMPT, None, GREEDY, stop_ids=[]) == greedy  # a cache of 256 positions
        graphs = counters["stats"]["unique_graphs"]
        generate(net, PROMPT, None, long, stop_ids=[])  # one of 512: the cache is replaced
    assert said == []  # no compile note
    assert counters["inductor"]["fxgraph_cache_hit"] > hits  # the code read from the folder
    assert sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file()) == before  # nothing compiled again
    assert net.text.cache.max_len > 256
    assert counters["stats"]["unique_graphs"] == graphs  # nothing traced again for the longer cache


def test_a_cache_that_cannot_be_written_leaves_the_eager_step(tiny_checkpoint, tmp_path, monkeypatch):
    blocker = tmp_path / "home"
    blocker.write_text("a file where the cache folder would go\n")  # fails even for root, unlike chmod
    monkeypatch.setenv("FFAI_HOME", str(blocker))
    with messages.collect() as said:
        got = tokens(tiny_checkpoint, GREEDY, compiled=True)
    assert [m.level for m in said] == ["warning"]
    assert "cannot write the compiled decode cache" in said[0].text and "runs uncompiled" in said[0].text
    assert got == tokens(tiny_checkpoint, GREEDY, compiled=False)


@pytest.mark.parametrize("dtype", ["float32", "int8", "bfloat16"])
@pytest.mark.parametrize("asked", ["1", "0"])
def test_loading_attaches_the_step_only_where_asked(tiny_checkpoint, monkeypatch, dtype, asked):
    monkeypatch.setenv(compiled_decode.ENV, asked)
    net = load_weights(tiny_checkpoint, RuntimeOptions(dtype=dtype, device="cpu"), parts=("text",))
    assert (net.text.compiled_decode is not None) is (asked == "1" and dtype == "int8")
