"""The engine kit (``ffai.kit``): its fast paths give exactly what the plain paths give, every engine
built on it passes one conformance test, and the kit never names an engine.

The fast paths: q/k/v and gate/up run as one matmul each; a one-row linear is spread over
torch's threads; the RoPE rows come from a table built once and rotate by one roll; RMSNorm is
torch's rms_norm on the CPU. Each is checked bit for bit against the separate / per-call path.
The conformance test (after mlx-lm's ``model_test_runner``) loads each engine's tiny checkpoint
and checks, through the kit's text tower: a whole prompt's logits equal its prefill plus cached
decode steps', q/k/v and gate/up fused equal them separate, and the model loads without torch's
symbolic-shape machinery. The oracle tests of each engine compare the same tower with transformers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ffai.kit
from ffai.bench import checkpoints
from ffai.engines import registry
from ffai.engines.contract import DecodingOptions
from ffai.kit.attention import causal_attention
from ffai.kit.generate import Prompt, decode_one_token, generate, prefill
from ffai.kit.linears import FusedLinear, linear
from ffai.kit.norms import RMSNorm
from ffai.kit.rope import apply_rope, rope_cos_sin
from ffai.kit.stages import EngineStages
from ffai.kit.weight_names import WeightNames, decoder_names
from ffai.pipeline.config import resolve
from kit_calls import tower

pytestmark = pytest.mark.usefixtures("one_torch_thread")
KIT = Path(ffai.kit.__file__).parent
ENGINES = ("smolvlm", "qwen3-vl")


@pytest.fixture(scope="module", params=ENGINES)
def engine_model(request, tiny_checkpoint, qwen3vl_tiny):
    """(engine name, its tiny checkpoint, its stages, its model loaded in float32)."""
    name = request.param
    folder = tiny_checkpoint if name == "smolvlm" else qwen3vl_tiny
    # The engine's stages as its contract names them: factories of an ffai.kit.stages.EngineStages.
    engine_stages = resolve(registry.get_engine(name).stages()[0].factory).__self__
    assert isinstance(engine_stages, EngineStages)
    return name, folder, engine_stages, engine_stages.load_model(folder)


def test_the_kit_names_no_engine():
    """The kit is the same for every family: no module of it names one, imports one or branches on a
    checkpoint's model_type (as mlx-vlm's generate loop, and unlike its prompt utilities)."""
    families = ("smolvlm", "idefics", "qwen", "llama")
    for path in sorted(KIT.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("ffai.engines.") and m != "ffai.engines.contract"], path
        code = "\n".join(  # names in code, not in docstrings and comments, which may cite the references
            ast.get_source_segment(text, node) or ""
            for node in ast.walk(tree)
            if isinstance(node, (ast.Name, ast.Attribute, ast.Constant))
            and not isinstance(getattr(node, "value", None), str)
        ).lower()
        assert not [f for f in families if f in code], path
        assert "model_type" not in code, path


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize(
    "shape",
    [(960, 576), (576, 576), (3072, 576), (576, 1536), (49280, 576), (256, 64), (768, 96), (36, 24), (24, 1536)],
)
def test_a_one_row_linear_over_threads_equals_f_linear_bit_for_bit(shape, threads):
    """A decode step's matrix-vector products, split over threads: every output identical to F.linear's."""
    torch.manual_seed(shape[0] + threads)
    weight = torch.randn(shape)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for x in (torch.randn(1, 1, shape[1]), torch.randn(1, shape[1]), torch.randn(1, 5, shape[1])[:, -1:]):
            assert torch.equal(linear(x, weight), F.linear(x, weight))
        wide = torch.randn(2, 3, shape[1])  # more than one row: F.linear itself
        assert torch.equal(linear(wide, weight), F.linear(wide, weight))
    finally:
        torch.set_num_threads(before)


def test_fused_linears_equal_separate_ones_bit_for_bit():
    torch.manual_seed(0)
    linears = [nn.Linear(48, 40), nn.Linear(48, 16), nn.Linear(48, 16)]
    fused = FusedLinear(48, (40, 16, 16), bias=True)
    with torch.no_grad():
        for lin, rows in zip(linears, fused.part_rows()):
            fused.weight[rows] = lin.weight
            fused.bias[rows] = lin.bias
        for x in (torch.randn(2, 7, 48), torch.randn(1, 1, 48)):
            assert torch.equal(fused(x), torch.cat([lin(x) for lin in linears], dim=-1))


def _reference_rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm (and Qwen3's), step by step."""
    dtype = x.dtype
    y = x.to(torch.float32)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * y.to(dtype)


def test_rms_norm_equals_the_reference_steps_bit_for_bit():
    torch.manual_seed(4)
    norm = RMSNorm(64, 1e-6)
    with torch.no_grad():
        for i, rows in enumerate((1, 2, 37, 300)):
            norm.weight.copy_(torch.randn_like(norm.weight) * (i + 0.5))
            for scale in (1e-4, 1.0, 1e3):
                x = torch.randn(1, rows, norm.weight.shape[0]) * scale
                assert torch.equal(norm(x), _reference_rms_norm(norm, x)), (rows, scale)
            heads = torch.randn(1, rows, 6, 3 * 64)[..., :64]  # per-head norms read a strided slice
            assert torch.equal(norm(heads), _reference_rms_norm(norm, heads.contiguous()))


@pytest.mark.parametrize("hd, theta", [(64, 100000.0), (16, 10000.0), (128, 5e6)])
def test_rope_as_one_roll_equals_rotate_half_bit_for_bit(hd, theta):
    """The reference's x * cos + rotate_half(x) * sin, with its unsigned sin, against apply_rope
    with the signed sin of rope_cos_sin."""
    pos = torch.tensor([0, 1, 7, 300, 8191])
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    emb = torch.cat((pos.float()[:, None] * inv_freq,) * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    torch.manual_seed(5)
    x = torch.randn(1, 3, pos.shape[0], hd) * 10
    x1, x2 = x.chunk(2, dim=-1)
    reference = x * cos + torch.cat((-x2, x1), dim=-1) * sin
    ours_cos, ours_sin = rope_cos_sin(pos, hd, theta, torch.float32)
    assert torch.equal(ours_cos, cos)
    assert torch.equal(apply_rope(x, ours_cos, ours_sin), reference)


def test_weight_names_map_both_ways():
    names = WeightNames({"model.visual.*": "visual.*", **decoder_names("model.text.")})
    assert names.module_name("model.visual.blocks.3.attn.qkv.bias") == "visual.blocks.3.attn.qkv.bias"
    assert names.module_name("model.text.layers.12.self_attn.k_proj.weight") == "text.layers.12.self_attn.qkv.weight[1]"
    assert names.module_name("model.text.layers.2.mlp.up_proj.weight") == "text.layers.2.mlp.gate_up.weight[1]"
    assert names.module_name("lm_head.weight") == "text.lm_head.weight"
    assert names.module_name("model.other.weight") is None
    assert (
        names.checkpoint_name("text.layers.7.self_attn.qkv.weight[2]") == "model.text.layers.7.self_attn.v_proj.weight"
    )
    assert names.checkpoint_name("visual.merger.norm.weight") == "model.visual.merger.norm.weight"


def test_building_a_model_skips_torch_symbolic_machinery(engine_model):
    """nn.Embedding's default init (normal_) on the meta device imports sympy and friends, which
    stay resident in every process that loads a model."""
    name, folder, _, _ = engine_model
    ref = registry.get_engine(name).stages()[0].factory.rpartition(".")[0]  # "module:STAGES"
    code = f"import sys; from ffai.pipeline.config import resolve; resolve({ref!r}).load_model({str(folder)!r}); "
    code += "print('sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def separate(lin: FusedLinear, x: torch.Tensor) -> list[torch.Tensor]:
    """What the reference computes: one linear per part, each weight a tensor of its own."""
    bias = [None] * len(lin.parts) if lin.bias is None else [lin.bias[r].clone() for r in lin.part_rows()]
    return [F.linear(x, lin.weight[r].clone(), b) for r, b in zip(lin.part_rows(), bias)]


def test_fused_projections_equal_separate_ones(engine_model):
    """Each text layer's attention and MLP as the references run them (separate q, k, v, gate and
    up projections, q and k normalised per head where the tower does, RoPE on q and k apart),
    against the kit's fused forward: the same bits."""
    _, _, _, model = engine_model
    torch.manual_seed(1)
    text, t = model.text, 19
    with torch.no_grad():
        rope = text.rope_rows(0, t)
        for layer in text.layers:
            attn, mlp = layer.self_attn, layer.mlp
            x = torch.randn(1, t, text.cfg.hidden_size)
            q, k, v = (y.view(1, t, -1, attn.head_dim) for y in separate(attn.qkv, x))
            if attn.q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = (y.transpose(1, 2) for y in (q, k, v))
            scale, gqa = attn.head_dim**-0.5, attn.n_heads != attn.n_kv
            y = causal_attention(apply_rope(q, *rope), apply_rope(k, *rope), v, scale, gqa)
            assert torch.equal(attn(x, rope, slice(0, t), None), attn.o_proj(y.transpose(1, 2).reshape(1, t, -1)))
            gate, up = separate(mlp.gate_up, x)
            assert torch.equal(mlp(x), mlp.down_proj(F.silu(gate) * up))


def test_prefill_and_cached_steps_equal_the_whole_sequence(engine_model):
    """The conformance test: a sequence run whole (no cache) gives the logits of its prefill and of
    each cached decode step after it, and greedy generation picks each step's argmax."""
    _, _, _, model = engine_model
    text = model.text
    torch.manual_seed(6)
    ids = torch.randint(0, text.cfg.vocab_size, (1, 23))
    with torch.no_grad():
        x = text.embed(ids)
        whole = tower(text, x)[0]  # (T, vocab)
        cache = text.new_cache(1, 32)
        steps = [prefill(text, Prompt(x[:, :16]), cache)[0]]
        for i in range(16, 23):
            steps.append(decode_one_token(text, ids[:, i], i, i, cache)[0])
    torch.testing.assert_close(torch.stack(steps), whole[15:], rtol=0, atol=2e-5)
    options = DecodingOptions(max_new_tokens=6, force_new_tokens=True)
    tokens = generate(text, Prompt(x[:, :16]), options, stop_ids=[])
    with torch.no_grad():
        full = torch.cat([ids[:, :16], torch.tensor([tokens[:-1]])], dim=1)
        recomputed = tower(text, text.embed(full))[0, 15:].argmax(-1).tolist()
    assert recomputed == tokens


def test_the_tower_reuses_its_cache_and_grows_its_rope_table(engine_model):
    _, _, _, model = engine_model
    text = model.text
    text.cache = None
    cache = text.reserve_cache(1, 40)
    assert text.reserve_cache(1, 10) is cache and cache.max_len % 256 == 0
    bigger = text.reserve_cache(1, cache.max_len + 1)
    assert bigger is not cache and text.reserve_cache(1, 10) is bigger
    far = text.cfg.max_position_embeddings - 1
    cos, sin = text.rope_rows(far, far + 1)
    want = rope_cos_sin(torch.tensor([far]), text.cfg.head_dim, text.cfg.rope_theta, text.dtype)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])


def test_the_kit_bench_counts_the_text_towers_weights(engine_model):
    """The decode floor's numerator is the tower's weights as loaded (embedding table, layers, norm, head)."""
    name, folder, _, model = engine_model
    from ffai.bench.hooks import hooks_for

    assert hooks_for(name).decode_weights(folder) == sum(p.numel() for p in model.text.parameters())


def test_checkpoint_kinds_are_cached_per_engine(engine_model):
    name, folder, _, _ = engine_model
    assert folder.parent == checkpoints.CACHE and folder.name.startswith(f"{name}-tiny-")
