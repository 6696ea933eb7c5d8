"""int8's compiled decode step (ffai/kit/compiled_decode.py) on SmolVLM's tiny checkpoint: its
logits agree with the eager step's, fed the same tokens, above the int8 gate with the issue's
margin (it sums float32 rows, or quantises them to 8 bits for fbgemm's kernel, where eager
multiplies bfloat16 rows, so tokens may part at near ties), and so does the module it is
compiled from, run eagerly with a wide bfloat16 layer (the real plan's first four); a fresh load
reads the AOTInductor package from disk (no compile note, no file added to the cache folder) and
serves a longer cache with it; a cache folder that cannot be written, or a package that cannot
be read, leaves the eager step with one warning; the cache's key is the weights' sha256 (a hub
blob's name, else the file hashed once and recorded); loading attaches the step only where
``--compile`` (``RuntimeOptions.compile``) asks, and says so where the dtype has none.

The compile is paid once, by a module fixture, with inductor compiling in this process: its
worker processes cost more to start than the tiny graph costs to compile. The module runs at two
torch threads, so the step compiled is the one a machine of two cores or more runs (its int8 rows
by the kernel this CPU takes there: inductor's sums, or fbgemm's on AMX); the other kernel is
checked as the module it is compiled from, run eagerly, and the choice between them by the
thread count and the CPU. bfloat16's step (its linears float32 sums of the bfloat16 weights,
which the layers then hold plain, once) is compiled by a test of its own.

The tiny tower's two layers are among those the int8 plan keeps wider, so the model here is
loaded with every text linear int8 by row (the LM head on fbgemm), as the real plan's later layers."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest
import torch

from ffai import messages
from ffai.engines.contract import DecodingOptions, RuntimeOptions
from ffai.engines.smolvlm.precision import plan_precision
from ffai.engines.smolvlm.stages import STAGES
from ffai.errors import UsageError
from ffai.kit import compiled_decode, host
from ffai.kit.generate import Prompt, decode_one_token, prefill
from ffai.kit.linear_kinds import BF16_ONEDNN, FLOAT32, INT8, INT8_BY_ROW, compiled_row_kernel
from ffai.kit.loading import weight_files
from ffai.kit.opt_in_linears import PackedBf16Linear, QuantizedLinear, onednn_bf16
from kit_calls import generate_from

pytestmark = [
    pytest.mark.usefixtures("two_torch_threads"),
    # The module filters it for ffai's processes; pytest resets the filters for each test.
    pytest.mark.filterwarnings(r"ignore:fbgemm_\w+ is deprecated"),
]

PROMPT = [1, 11126, 42, 7, 900, 31, 2000, 5, 77, 12, 300]
GREEDY = DecodingOptions(max_new_tokens=12, force_new_tokens=True)
COSINE = 0.996  # the int8 gate's 0.995 with the margin


@pytest.fixture(scope="module")
def two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def load(path: Path, *, compiled: bool, wide: bool = False):
    linears = ((r"text\.lm_head$", INT8), (r".", INT8_BY_ROW))
    if wide:  # the first layer wider, as the real plan's first four
        linears = ((r"text\.layers\.0\.", BF16_ONEDNN), *linears)
    plan = dataclasses.replace(plan_precision("int8", "cpu"), linears=linears)
    net = STAGES.load_model(path, plan, parts=("text",))
    if compiled:
        compiled_decode.attach(net.text, weight_files(path), "int8")
    return net


def tokens(path: Path, *options: DecodingOptions, compiled: bool) -> list[list[int]]:
    """The tokens of one load for each of ``options``, in order."""
    net = load(path, compiled=compiled)
    with torch.inference_mode():
        return [generate_from(net, PROMPT, None, options=o, stop_ids=[]) for o in options]


def fed(net, ids: list[int], cache=None) -> list[torch.Tensor]:
    """The logits of each decode step of ``net`` after PROMPT's prefill, fed ``ids`` in turn, in
    ``cache`` (default: a new one just long enough)."""
    cache = net.text.new_cache(1, len(PROMPT) + len(ids)) if cache is None else cache
    with torch.inference_mode():
        prefill(net.text, Prompt(net.embed(torch.tensor([PROMPT]), None)), cache)
        slots = range(len(PROMPT), len(PROMPT) + len(ids))
        return [decode_one_token(net.text, torch.tensor([t]), s, s, cache).float() for s, t in zip(slots, ids)]


@pytest.fixture(scope="module")
def compiled_home(tmp_path_factory, tiny_checkpoint):
    """An FFAI_HOME whose cache holds the tiny checkpoint's compiled step, its net and greedy tokens."""
    home = tmp_path_factory.mktemp("ffai-home")
    with pytest.MonkeyPatch.context() as mp, torch._inductor.config.patch(compile_threads=1):
        mp.setenv("FFAI_HOME", str(home))
        with messages.collect() as said:
            net = load(tiny_checkpoint, compiled=True)
            with torch.inference_mode():
                greedy = generate_from(net, PROMPT, None, options=GREEDY, stop_ids=[])
    return home, net, greedy, said


@pytest.mark.slow  # the compile: the step through inductor and the C++ compiler
def test_compiled_step_agrees_with_the_eager_step(compiled_home, tiny_checkpoint):
    home, net, greedy, said = compiled_home
    assert [m.level for m in said] == ["note"] and "compiling the int8 decode step" in said[0].text
    assert net.text.compiled_decode.runner is not None
    assert net.text.compiled_decode.kernel == compiled_row_kernel(2, host.cpu_info().flags)
    (eager_tokens,) = tokens(tiny_checkpoint, GREEDY, compiled=False)
    eager = fed(load(tiny_checkpoint, compiled=False), eager_tokens)
    compiled = fed(net, eager_tokens)
    cosines = [float(torch.nn.functional.cosine_similarity(a, b, dim=-1)) for a, b in zip(compiled, eager)]
    assert min(cosines) >= COSINE, cosines
    assert any(not torch.equal(a, b) for a, b in zip(compiled, eager))  # the package ran, not eager
    assert len(set(eager_tokens)) > 1  # not one token repeated: the steps differ


@pytest.mark.slow
def test_the_compiled_step_reads_only_the_caches_filled_prefix(compiled_home):
    """A cache reused from a longer request holds stale keys and values after the prefix: here
    NaN, which any product with them (a masked score's zero weight too) would carry to the logits."""
    _, net, greedy, _ = compiled_home
    clean, stale = net.text.new_cache(1, 256), net.text.new_cache(1, 256)
    for tensor in (*stale.k, *stale.v):
        tensor.fill_(float("nan"))
    steps = [fed(net, greedy[:4], cache) for cache in (clean, stale)]
    assert net.text.compiled_decode.runner is not None
    for a, b in zip(*steps):
        assert torch.equal(a, b)


def load_bf16(path: Path, *, compiled: bool):
    """bfloat16's plan with the tiny tower's first layer float32 and the rest packed bfloat16, as
    the real plan's first four and later layers."""
    linears = ((r"text\.layers\.0\.", FLOAT32), (r".", BF16_ONEDNN))
    net = STAGES.load_model(
        path, dataclasses.replace(plan_precision("bfloat16", "cpu"), linears=linears), parts=("text",)
    )
    if compiled:
        compiled_decode.attach(net.text, weight_files(path), "bfloat16")
    return net


@pytest.mark.slow  # a second compile
@pytest.mark.skipif(not onednn_bf16(), reason="bfloat16's step is compiled where oneDNN has native bfloat16")
def test_the_bfloat16_step_agrees_and_holds_each_weight_once(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("FFAI_HOME", str(tmp_path))
    with torch._inductor.config.patch(compile_threads=1), messages.collect() as said:
        net = load_bf16(tiny_checkpoint, compiled=True)
    assert [m.level for m in said] == ["note"] and "compiling the bfloat16 decode step" in said[0].text
    step = net.text.compiled_decode
    assert step.runner is not None
    kinds = {m.kind for m in step._step.modules() if isinstance(m, compiled_decode.FrozenLinear)}
    assert kinds == {"float32", "bf16"}
    packed = [m for m in net.text.modules() if isinstance(m, PackedBf16Linear)]
    # Each layer holds the plain weight the package reads, not a reordered copy beside it.
    assert packed and not any(m.packed.is_mkldnn for m in packed)
    held = {m.weight.data_ptr() for m in step._step.modules() if isinstance(m, compiled_decode.FrozenLinear)}
    assert {m.packed.data_ptr() for m in packed} <= held
    eager_net = load_bf16(tiny_checkpoint, compiled=False)
    with torch.inference_mode():
        (ids,) = [generate_from(eager_net, PROMPT, None, options=GREEDY, stop_ids=[])]
    eager, compiled = fed(eager_net, ids), fed(net, ids)
    cosines = [float(torch.nn.functional.cosine_similarity(a, b, dim=-1)) for a, b in zip(compiled, eager)]
    assert min(cosines) >= 0.9995, cosines  # the bfloat16 gate
    assert any(not torch.equal(a, b) for a, b in zip(compiled, eager))  # the package ran, not eager


@pytest.mark.skipif(not onednn_bf16(), reason="bfloat16's step is compiled where oneDNN has native bfloat16")
def test_a_bfloat16_step_that_fails_gives_the_layers_their_reordered_weights_back(
    tiny_checkpoint, tmp_path, monkeypatch
):
    monkeypatch.setenv("FFAI_HOME", str(tmp_path))
    folder = compiled_decode.cache_dir(weight_files(tiny_checkpoint), "bfloat16")
    folder.mkdir(parents=True)
    (folder / compiled_decode.PACKAGE).write_bytes(b"not a zip\n")
    with messages.collect() as said:
        net = load_bf16(tiny_checkpoint, compiled=True)
    assert [m.level for m in said] == ["warning"] and "could not load" in said[0].text
    packed = [m for m in net.text.modules() if isinstance(m, PackedBf16Linear)]
    assert packed and all(m.packed.is_mkldnn for m in packed)
    eager_net = load_bf16(tiny_checkpoint, compiled=False)
    with torch.inference_mode():
        compiled = generate_from(net, PROMPT, None, options=GREEDY, stop_ids=[])
        assert compiled == generate_from(eager_net, PROMPT, None, options=GREEDY, stop_ids=[])


@pytest.mark.skipif(not onednn_bf16(), reason="the wide layers are bfloat16 where oneDNN has native bfloat16")
@pytest.mark.parametrize("kernel", ["fbgemm", "sums"])
def test_the_steps_module_agrees_with_the_eager_step_over_a_wide_layer(tiny_checkpoint, kernel):
    # The module the package is compiled from, run eagerly (no compile): its forms of the wide
    # bfloat16 layer (float32 sums) and of the int8 ones (``kernel``) against eager's layers.
    net = load(tiny_checkpoint, compiled=False, wide=True)
    (ids,) = tokens(tiny_checkpoint, GREEDY, compiled=False)
    eager = fed(net, ids)
    step = compiled_decode.FrozenStep(net.text, head=True, kernel=kernel).eval()
    assert {m.kind for m in step.modules() if isinstance(m, compiled_decode.FrozenLinear)} == {"bf16", kernel}

    def frozen(x, slot, rope, cache):  # in CompiledDecode's place: the package's inputs, the module run eagerly
        return step(x, torch.tensor([slot]), *rope, list(cache.k), list(cache.v))

    net.text.compiled_decode = frozen
    stepped = fed(net, ids)
    cosines = [float(torch.nn.functional.cosine_similarity(a, b, dim=-1)) for a, b in zip(stepped, eager)]
    assert min(cosines) >= COSINE, cosines
    assert any(not torch.equal(a, b) for a, b in zip(stepped, eager))


def test_the_row_kernel_is_chosen_by_the_thread_count_and_the_cpu(tiny_checkpoint, tmp_path):
    zen4 = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})
    amx = zen4 | {"amx_tile", "amx_int8", "amx_bf16"}
    assert [compiled_row_kernel(threads, zen4) for threads in (1, 2, 4)] == ["fbgemm", "sums", "sums"]
    assert [compiled_row_kernel(threads, amx) for threads in (1, 2, 4)] == ["fbgemm", "fbgemm", "fbgemm"]
    net = load(tiny_checkpoint, compiled=False)
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        try:
            kernel = compiled_decode.CompiledDecode(net.text, tmp_path, "int8").kernel
            assert kernel == compiled_row_kernel(threads, host.cpu_info().flags)
        finally:
            torch.set_num_threads(2)


@pytest.mark.slow
def test_a_fresh_load_reads_the_package_and_serves_a_longer_cache(compiled_home, tiny_checkpoint, monkeypatch):
    home, _, greedy, _ = compiled_home
    (folder,) = (p for p in (home / "compiled").iterdir() if p.is_dir())
    assert (folder / compiled_decode.PACKAGE).is_file()
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    monkeypatch.setenv("FFAI_HOME", str(home))
    net = load(tiny_checkpoint, compiled=True)
    long = DecodingOptions(max_new_tokens=300, force_new_tokens=True)
    with messages.collect() as said, torch.inference_mode():
        assert generate_from(net, PROMPT, None, options=GREEDY, stop_ids=[]) == greedy  # a cache of 256 positions
        longer = generate_from(net, PROMPT, None, options=long, stop_ids=[])  # one of 512: the cache is replaced
    assert said == []  # no compile note
    assert net.text.compiled_decode.runner is not None and net.text.compiled_decode.load_s < 2
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before  # nothing compiled again
    assert net.text.cache.max_len > 256 and longer[: len(greedy)] == greedy


def test_a_package_that_cannot_be_read_leaves_the_eager_step(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("FFAI_HOME", str(tmp_path))
    folder = compiled_decode.cache_dir(weight_files(tiny_checkpoint), "int8")
    folder.mkdir(parents=True)
    (folder / compiled_decode.PACKAGE).write_bytes(b"not a zip\n")  # a truncated or foreign file
    with messages.collect() as said:
        got = tokens(tiny_checkpoint, GREEDY, compiled=True)
    assert [m.level for m in said] == ["warning"]
    assert "could not load the compiled decode step" in said[0].text and "runs uncompiled" in said[0].text
    assert got == tokens(tiny_checkpoint, GREEDY, compiled=False)


def test_an_fbgemm_linear_holds_the_packed_weight_alone_and_multiplies_as_the_eager_head():
    # The LM head's eager layer made the step's: fbgemm's packed copy, no plain int8 weight beside
    # it, and the same products as the eager layer's up to float32 rounding, for one row or several.
    weight = torch.randn(300, 64, generator=torch.Generator().manual_seed(0)) * 0.05
    eager = QuantizedLinear(weight, None, reduce_range=False)
    frozen = compiled_decode.FrozenLinear(eager, "fbgemm")
    assert frozen.kind == "fbgemm" and set(dict(frozen.named_buffers())) == {"packed", "offsets", "zero", "scale"}
    for rows in (1, 5):
        x = torch.randn(1, rows, 64, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(frozen(x), eager(x), rtol=1e-6, atol=1e-5)


@pytest.mark.slow
def test_an_fbgemm_step_lends_its_lm_head_to_the_prefill(compiled_home):
    _, net, _, _ = compiled_home
    step = net.text.compiled_decode
    if step.kernel == "fbgemm":  # one packed copy of the head for both
        assert net.text.lm_head is step._step.lm_head
    else:  # the step's head reads the plain int8 weight; the prefill keeps fbgemm's eager layer
        assert isinstance(net.text.lm_head, QuantizedLinear) and step._step.lm_head.kind == step.kernel


def test_row_sums_by_blocks_are_the_whole_weights_int32_sums():
    # fbgemm's row offsets, summed a block of rows at a time: the same integers as one sum over
    # the whole weight, a last block shorter than the others included.
    weight = torch.randint(-127, 128, (1000, 96), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    whole = weight.sum(1, dtype=torch.int32)
    for rows in (1, 7, 256, 4096):
        blocks = compiled_decode.row_sums(weight, rows)
        assert blocks.dtype == torch.int32 and torch.equal(blocks, whole)


def test_the_key_is_the_weights_sha256(tmp_path, monkeypatch):
    monkeypatch.setenv("FFAI_HOME", str(tmp_path / "home"))
    digest = "ab" * 32
    blob = tmp_path / "hub" / "blobs" / digest
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"not what the name says")  # a hub blob is named by its checked sha256: not read
    link = tmp_path / "hub" / "snapshots" / "model.safetensors"
    link.parent.mkdir()
    link.symlink_to(blob)
    assert compiled_decode.weight_sha256(link) == digest
    local = tmp_path / "model.safetensors"
    local.write_bytes(b"weights")
    assert compiled_decode.weight_sha256(local) == hashlib.sha256(b"weights").hexdigest()
    key = compiled_decode.cache_dir([local], "int8")
    st = local.stat()
    local.write_bytes(b"Weights")
    os.utime(local, ns=(st.st_atime_ns, st.st_mtime_ns))  # same path, size and mtime: another file
    assert compiled_decode.weight_sha256(local) == hashlib.sha256(b"Weights").hexdigest()
    assert compiled_decode.cache_dir([local], "int8") != key


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
@pytest.mark.parametrize("asked", [True, False])
def test_loading_attaches_the_step_only_where_asked(tiny_checkpoint, monkeypatch, tmp_path, dtype, asked):
    if asked and dtype == "float32":
        with pytest.raises(UsageError, match="--compile is for the opt-in dtypes"):
            RuntimeOptions(dtype=dtype, compile=True)
        return
    # The tiny plan's two text layers are among the wider first four: nothing compiles.
    monkeypatch.setenv("FFAI_HOME", str(tmp_path))
    with messages.collect() as said:
        net = STAGES.load(tiny_checkpoint, RuntimeOptions(dtype=dtype, device="cpu", compile=asked), parts=("text",))
    assert (net.text.compiled_decode is not None) is asked
    # Asked for, a step that cannot be had is one warning.
    assert [m.level for m in said] == (["warning"] if asked else [])
    if asked:
        assert "uncompiled" in said[0].text and "nothing is compiled" in said[0].text or not onednn_bf16()
    assert not any((tmp_path / "compiled").glob("decode-*"))
