"""Config parsing, other model shapes against transformers, and weight-loading errors."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ffai.engines.smolvlm.bench import checkpoints
from ffai.engines.smolvlm.config import ModelConfig
from ffai.engines.smolvlm.precision import plan_precision
from ffai.engines.smolvlm.stages import STAGES
from ffai.engines.smolvlm.weights import NAMES
from ffai.errors import ModelError
from ffai.kit import tensor_files as safetensors_reads
from ffai.kit.linear_kinds import FLOAT32
from ffai.kit.loading import model_tensor as tensor_of
from ffai.kit.loading import param_dtypes, slots
from ffai.kit.opt_in_linears import onednn_bf16
from kit_calls import tower

load_model = STAGES.load_model


def model_tensor(model, name: str):
    return tensor_of(model, NAMES, name)


REAL_CONFIG = checkpoints.REFERENCE_DIR / "config.json"


def real_dict() -> dict:
    return json.loads(REAL_CONFIG.read_text())


# --- config.json ---------------------------------------------------------------------------


def test_real_config_values():
    cfg = ModelConfig.from_dir(REAL_CONFIG.parent)
    assert (cfg.vision.hidden_size, cfg.vision.num_layers, cfg.vision.patch_size) == (768, 12, 16)
    assert (cfg.vision.image_size, cfg.vision.hidden_act, cfg.vision.layer_norm_eps) == (512, "gelu_pytorch_tanh", 1e-6)
    t = cfg.text
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads) == (576, 30, 9, 3)
    assert (t.head_dim, t.rope_theta, t.rms_norm_eps, t.vocab_size) == (64, 100000.0, 1e-5, 49280)
    assert t.max_position_embeddings == 8192
    assert cfg.tie_word_embeddings is False
    assert (cfg.scale_factor, cfg.image_token_id, cfg.image_seq_len, cfg.connector_in_features) == (4, 49190, 64, 12288)


def test_tiny_geometry_is_derived(tiny_checkpoint):
    cfg = ModelConfig.from_dir(tiny_checkpoint)
    assert (cfg.vision.image_size, cfg.vision.patch_size, cfg.scale_factor, cfg.image_seq_len) == (64, 8, 2, 16)
    assert cfg.text.rope_theta == 10000.0  # written by transformers 5.x as rope_parameters
    assert "rope_parameters" in json.loads((tiny_checkpoint / "config.json").read_text())["text_config"]


def test_both_rope_layouts_agree():
    old = real_dict()
    new = copy.deepcopy(old)
    new["text_config"].pop("rope_theta")
    new["text_config"]["rope_parameters"] = {"rope_type": "default", "rope_theta": 100000}
    assert ModelConfig.from_dict(old) == ModelConfig.from_dict(new)


@pytest.mark.parametrize(
    "path",
    [
        ("text_config", "hidden_size"),
        ("vision_config", "patch_size"),
        ("scale_factor",),
        ("text_config", "rope_theta"),
        ("image_token_id",),
        ("vision_config",),
    ],
)
def test_missing_key_names_file_and_key(path):
    d = real_dict()
    section = d
    for key in path[:-1]:
        section = section[key]
    del section[path[-1]]
    with pytest.raises(ModelError, match=r"myckpt/config\.json: missing required key " + r"\.".join(path)):
        ModelConfig.from_dict(d, source="myckpt/config.json")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(model_type="llava"), "model_type 'llava' is not supported"),
        (lambda d: d.pop("model_type"), "missing required key model_type"),
        (lambda d: d["text_config"].update(model_type="mistral"), "text_config: model_type 'mistral'"),
        (lambda d: d["text_config"].update(rope_scaling={"type": "linear", "factor": 2}), "rope_scaling"),
        (lambda d: d["text_config"].update(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (lambda d: d["text_config"].update(num_key_value_heads=4), "num_key_value_heads"),
        (lambda d: d["vision_config"].update(hidden_size="768"), "vision_config.hidden_size must be int"),
        (lambda d: d.update(scale_factor=5), "scale_factor"),
    ],
)
def test_unsupported_or_malformed_config(edit, message):
    d = real_dict()
    edit(d)
    with pytest.raises(ModelError, match=message):
        ModelConfig.from_dict(d, source="x/config.json")


def test_unreadable_config_files(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match=r"config\.json: cannot read config"):
        ModelConfig.from_dir(tmp_path)


# --- the model folder's files agree, checked before any weight loads ------------------------


def small_files_copy(tiny_checkpoint: Path, out: Path) -> Path:
    """The tiny checkpoint without its weights: a run that reaches them fails differently."""
    shutil.copytree(tiny_checkpoint, out, ignore=shutil.ignore_patterns("*.safetensors"))
    return out


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def caption_error(capsys, model: Path, tmp_path: Path) -> tuple[int, str]:
    from PIL import Image

    from ffai.cli import run

    image = tmp_path / "image.png"
    Image.new("RGB", (48, 32), (20, 120, 220)).save(image)
    code = run(["caption", "-i", str(image), "--model", str(model)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ffai: error: ") and "Traceback" not in err, err
    return code, lines[0]


def test_image_seq_len_of_another_checkpoint_is_refused(capsys, tiny_checkpoint, tmp_path):
    model = small_files_copy(tiny_checkpoint, tmp_path / "mixed")
    edit_json(model / "processor_config.json", lambda d: d.update(image_seq_len=64))
    code, line = caption_error(capsys, model, tmp_path)
    assert code == 1
    assert f"{model / 'processor_config.json'}: image_seq_len 64 does not match {model / 'config.json'}" in line
    assert "16 image tokens each" in line


def test_image_token_of_another_checkpoint_is_refused(capsys, tiny_checkpoint, tmp_path):
    model = small_files_copy(tiny_checkpoint, tmp_path / "mixed")
    edit_json(model / "config.json", lambda d: d.update(image_token_id=49189))
    code, line = caption_error(capsys, model, tmp_path)
    assert code == 1
    assert (
        f"{model / 'tokenizer.json'}: <image> is token 49190, but {model / 'config.json'} has image_token_id 49189"
        in line
    )


def test_agreeing_small_files_pass_the_check(capsys, tiny_checkpoint, tmp_path):
    """The unedited copy gets past the check and fails only at the weights it lacks."""
    model = small_files_copy(tiny_checkpoint, tmp_path / "same")
    code, line = caption_error(capsys, model, tmp_path)
    assert code == 1 and "no model.safetensors" in line


# --- other shapes, same code, against transformers -----------------------------------------


def variant_500m_like() -> dict:
    """SmolVLM-500M text widths (960 hidden, 15 heads / 5 kv heads) with a SigLIP-384/14 tile and
    scale factor 3 (27 patches per side, 81 image tokens per tile); two layers per tower."""
    d = real_dict()
    d["text_config"].update(
        num_hidden_layers=2,
        hidden_size=960,
        intermediate_size=2560,
        num_attention_heads=15,
        num_key_value_heads=5,
        head_dim=64,
        vocab_size=2048,
    )
    d["vision_config"].update(num_hidden_layers=2, patch_size=14, image_size=384)
    d.update(scale_factor=3, image_token_id=2000, vocab_size=2048)
    return d


def variant_tied_biased() -> dict:
    """Tied head, q/k/v/o and MLP biases, no GQA, odd rope theta, 4.46-style config."""
    d = real_dict()
    d["text_config"].update(
        num_hidden_layers=2,
        hidden_size=96,
        intermediate_size=160,
        num_attention_heads=3,
        num_key_value_heads=3,
        head_dim=32,
        vocab_size=1024,
        rope_theta=5000.0,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
    )
    d["vision_config"].update(
        num_hidden_layers=1, hidden_size=48, intermediate_size=96, num_attention_heads=4, patch_size=4, image_size=32
    )
    d.update(scale_factor=2, image_token_id=1000, vocab_size=1024, tie_word_embeddings=True)
    return d


def save_reference(config: dict, out: Path, seed: int = 0):
    ref = checkpoints.WRITER.build_model(config, seed)
    ref.save_pretrained(out, safe_serialization=True)
    return ref


def random_inputs(cfg: ModelConfig, n_tiles: int, seed: int = 0):
    """Tiles in [-1, 1]; the last one padded (only its top-left part real), ids with image slots."""
    gen = torch.Generator().manual_seed(seed)
    size = cfg.vision.image_size
    pixels = torch.rand(1, n_tiles, 3, size, size, generator=gen) * 2 - 1
    mask = torch.ones(1, n_tiles, size, size, dtype=torch.long)
    h, w = size * 2 // 3, size // 2 + 1
    mask[0, -1], pixels[0, -1] = 0, 0.0
    mask[0, -1, :h, :w] = 1
    pixels[0, -1, :, :h, :w] = torch.rand(3, h, w, generator=gen) * 2 - 1
    text = torch.randint(0, cfg.image_token_id, (n_tiles + 1, 5), generator=gen)
    image = torch.full((n_tiles, cfg.image_seq_len), cfg.image_token_id)
    ids = torch.cat([text[0]] + [torch.cat([image[i], text[i + 1]]) for i in range(n_tiles)])[None]
    return pixels, mask, ids


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.oracle
@pytest.mark.parametrize("variant", [variant_500m_like, variant_tied_biased])
def test_other_shapes_match_reference(variant, tmp_path):
    ref = save_reference(variant(), tmp_path)
    model = load_model(tmp_path)
    cfg = model.cfg
    pixels, mask, ids = random_inputs(cfg, n_tiles=2)
    with torch.no_grad():
        theirs = torch.cat(ref.model.get_image_features(pixels, mask).pooler_output)
        ours = model.encode_images(pixels, mask)
        assert ours.shape == (2, cfg.image_seq_len, cfg.text.hidden_size)
        assert rel_err(ours.reshape(theirs.shape), theirs) <= 1e-5
        want = ref(input_ids=ids, pixel_values=pixels, pixel_attention_mask=mask).logits
        got = tower(model.text, model.embed(ids, ours))
    assert (got - want).abs().max() <= 1e-4


def test_tied_checkpoint_has_no_head_and_shares_it(tmp_path):
    save_reference(variant_tied_biased(), tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
    model = load_model(tmp_path)
    assert model.text.lm_head.weight is model.text.embed_tokens.weight


@pytest.mark.skipif(not onednn_bf16(), reason="this CPU has no native bfloat16 matmul")
def test_tied_bfloat16_head_is_the_embedding_table_read_as_bfloat16(tmp_path, monkeypatch):
    """--dtype bfloat16 packs a tied head from the embedding table read from the file as
    bfloat16, in blocks of rows (3 here, so the blocks split the table); the lookups read the
    float32 table's rows from the file."""

    save_reference(variant_tied_biased(), tmp_path)
    monkeypatch.setattr(safetensors_reads, "CAST_BLOCK_BYTES", 3 * 4 * 96)  # 3 rows of the 96-wide table
    model = load_model(tmp_path, plan_precision("bfloat16"))
    table = load_model(tmp_path).text.embed_tokens.weight
    every_row = torch.arange(table.shape[0])
    assert torch.equal(model.text.embed_tokens(every_row), table)
    x = torch.randn(4, 96)
    assert torch.equal(model.text.lm_head(x), F.linear(x.bfloat16(), table.bfloat16()).float())
    # The blockwise cast itself: 1024 rows in blocks of 3, the last one short.
    from safetensors import safe_open

    name = "model.text_model.embed_tokens.weight"
    path = tmp_path / "model.safetensors"
    with safe_open(str(path), framework="pt") as f, open(path, "rb") as raw:
        read = safetensors_reads.RawHeader(raw).read_into(name, torch.empty(1024, 96, dtype=torch.bfloat16), f)
        assert torch.equal(read, f.get_tensor(name).bfloat16())


# --- weights: the name table and error paths -----------------------------------------------


def test_saved_names_match_the_table_both_ways(tiny_checkpoint):
    """transformers 5.24's save_pretrained writes exactly the table's names (no conversion)."""
    from safetensors import safe_open

    with safe_open(str(tiny_checkpoint / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    model = load_model(tiny_checkpoint)
    expected = [NAMES.checkpoint_name(target) for target in slots(model)]
    assert saved == set(expected) and len(expected) == len(saved)
    prefixes = {k.split(".{}")[0].split(".")[0] for k in NAMES.table}
    assert prefixes == {"model", "lm_head"}


@pytest.fixture()
def tiny_copy(tiny_checkpoint, tmp_path) -> Path:
    out = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, out)
    return out


def rewrite(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_truncated_safetensors(tiny_copy):
    f = tiny_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ModelError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model(tiny_copy)


def test_garbage_safetensors(tiny_copy):
    (tiny_copy / "model.safetensors").write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(ModelError, match=r"model\.safetensors"):
        load_model(tiny_copy)


def test_missing_tensor(tiny_copy):
    rewrite(tiny_copy / "model.safetensors", lambda t: t.pop("model.text_model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelError, match=r"missing tensor\(s\) model\.text_model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(tiny_copy)


def test_a_part_load_still_checks_the_whole_checkpoint(tiny_copy):
    rewrite(tiny_copy / "model.safetensors", lambda t: t.pop("model.vision_model.post_layernorm.bias"))
    with pytest.raises(ModelError, match=r"missing tensor\(s\) model\.vision_model\.post_layernorm\.bias"):
        load_model(tiny_copy, parts=("text",))


@pytest.mark.parametrize(
    "extra",
    [
        "model.text_model.layers.2.mlp.up_proj.weight",
        "model.text_model.layers.0.self_attn.q_proj.bias",
        "model.perceiver.latents",
    ],
)
def test_unexpected_tensor(tiny_copy, extra):
    rewrite(tiny_copy / "model.safetensors", lambda t: t.update({extra: torch.zeros(3)}))
    with pytest.raises(ModelError, match=rf"model\.safetensors: tensor {extra.replace('.', '[.]')} has no place"):
        load_model(tiny_copy)


def test_wrong_shape(tiny_copy):
    name = "model.connector.modality_projection.proj.weight"
    rewrite(tiny_copy / "model.safetensors", lambda t: t.update({name: torch.zeros(64, 100)}))
    with pytest.raises(ModelError, match=rf"tensor {name} has shape \[64, 100\], expected \[64, 128\]"):
        load_model(tiny_copy)


def test_no_weights_refuses_pickle(tiny_copy):
    (tiny_copy / "model.safetensors").rename(tiny_copy / "pytorch_model.bin")
    with pytest.raises(ModelError, match="pickle checkpoints are not loaded"):
        load_model(tiny_copy)


def test_sharded_checkpoint_loads_the_same(tiny_copy):
    from safetensors.torch import load_file, save_file

    tensors = load_file(tiny_copy / "model.safetensors")
    (tiny_copy / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, tiny_copy / shard, metadata={"format": "pt"})
        weight_map.update({k: shard for k in keys})
    (tiny_copy / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    model = load_model(tiny_copy)
    assert len(slots(model)) == len(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(model_tensor(model, name), tensor)
    (tiny_copy / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelError, match="model-00002-of-00002.safetensors: shard missing"):
        load_model(tiny_copy)


def test_loads_on_meta_then_fills_everything(tiny_checkpoint):
    plan = plan_precision("bfloat16")
    model = load_model(tiny_checkpoint, plan)
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    assert all(t.device.type == "cpu" for t in tensors.values())
    # --dtype bfloat16 keeps the text tower's embedding table and RMSNorm weights in float32 (the
    # residual stream stays float32, only the matmuls run in bfloat16), and its first four layers'
    # linears (plan.linear: FLOAT32); everything else is bfloat16.
    kept = {name for name, t in tensors.items() if t.dtype == torch.float32}
    assert kept == {name for name, dtype in param_dtypes(model, plan).items() if dtype == torch.float32} & set(tensors)
    assert "text.norm.weight" in kept
    # the embedding table too: loaded, or (where the head has its own packed copy) read from the file
    assert "text.embed_tokens.weight" in kept or model.text.embed_tokens.dtype == torch.float32
    wide = {name for name in kept if plan.linear(name.rpartition(".")[0]) == FLOAT32}
    assert all(name.startswith("text.") and ("norm" in name or "embed_tokens" in name) for name in kept - wide)
    assert all(t.dtype == torch.bfloat16 for name, t in tensors.items() if name not in kept)
    assert not any(p.requires_grad for p in model.parameters())
