"""SmolVLM's loading and vision tower take the fast paths and give exactly what the plain paths give:
q/k/v (both towers) and gate/up (text) read from the checkpoint into one buffer each, cast on read
in a bfloat16 load; the vision tower run tile by tile equals the whole batch. The kit's own fast
paths (one-row linears, fused projections, RoPE, RMSNorm) are tests/test_kit.py's.
"""

from __future__ import annotations

import pytest
import torch

from ffai.engines.smolvlm.precision import plan_precision
from ffai.engines.smolvlm.stages import STAGES
from ffai.engines.smolvlm.weights import NAMES
from ffai.kit.linears import FusedLinear
from ffai.kit.loading import model_tensor
from ffai.kit.opt_in_linears import PackedBf16Linear

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return STAGES.load_model(tiny_checkpoint)


def fused_linears(model) -> list[FusedLinear]:
    return [m for m in model.modules() if isinstance(m, FusedLinear)]


def test_loading_reads_each_fused_group_into_one_buffer_not_through_the_file_map(model, tiny_checkpoint):
    """Every q/k/v and gate/up is one buffer of exactly its own size (not a view of the
    memory-mapped file, not a concatenation after reading), and each of its parts holds the
    checkpoint's tensor bit for bit, as does every other parameter."""
    from safetensors import safe_open

    cfg = model.cfg
    fused = fused_linears(model)
    assert len(fused) == 2 * cfg.text.num_hidden_layers + cfg.vision.num_layers
    for lin in fused:
        for t in (lin.weight, lin.bias) if lin.bias is not None else (lin.weight,):
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    with safe_open(str(tiny_checkpoint / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            assert torch.equal(f.get_tensor(name), model_tensor(model, NAMES, name)), name


def test_a_fusion_group_in_a_bfloat16_load_is_cast_on_read(model, tiny_checkpoint):
    low = STAGES.load_model(tiny_checkpoint, plan_precision("bfloat16"))
    # the vision tower's: bfloat16 keeps the text tower's first four layers in float32
    qkv = low.vision.layers[0].self_attn.qkv  # packed for oneDNN where the CPU has native bfloat16
    a = qkv.dense_weight() if isinstance(qkv, PackedBf16Linear) else qkv.weight
    b = model.vision.layers[0].self_attn.qkv.weight
    assert a.dtype == torch.bfloat16 and a.untyped_storage().nbytes() == a.numel() * a.element_size()
    assert torch.equal(a, b.to(torch.bfloat16))


def _whole_batch(vision, pixels, mask):
    """The vision tower over every tile at once, as the reference runs it."""
    x = vision.embeddings(pixels, mask)
    key_mask = None if bool(mask.all()) else mask.reshape(mask.shape[0], 1, 1, -1)
    for layer in vision.layers:
        x = layer(x, key_mask)
    return vision.post_layernorm(x)


@pytest.mark.parametrize("padded", [False, True])
def test_vision_tile_by_tile_equals_the_whole_batch(model, padded):
    from ffai.engines.smolvlm.model import patch_mask

    torch.manual_seed(3)
    size = model.cfg.vision.image_size
    pixels = torch.randn(5, 3, size, size)
    mask = torch.ones(5, size, size, dtype=torch.bool)
    if padded:
        mask[2, :, size // 2 :] = False  # one tile half padding: every tile takes the masked path
    patches = patch_mask(mask, model.cfg.vision.patch_size)
    with torch.no_grad():
        assert torch.equal(model.vision(pixels, patches), _whole_batch(model.vision, pixels, patches))
