"""Random-weight Qwen3-VL checkpoints for the tests and the bench, written with transformers, plus
the transformers reference loaded on them.

No real weights are reachable, so the oracle tests compare ffai's port and transformers on a
checkpoint both load from the same files, written by ``Qwen3VLForConditionalGeneration(config)
.save_pretrained`` with every tensor re-drawn from one seed. Two shapes:

- ``2b``: Qwen3-VL-2B-Instruct's own config.json (``files/qwen3-vl-2b-instruct``), ~8.5 GB of
  float32 weights under the real tensor names; the config.json written is the hub's file verbatim
  (``rope_theta`` beside ``rope_scaling``), so the loader is tested against what the hub holds.
- ``tiny``: the same structure, small: a 4-block vision tower with DeepStack after blocks 1 and 2,
  a 6x6 table of position embeddings (resampled up and down to every grid), a 3-layer text tower
  with GQA (4 heads over 2) and mRoPE sections [4, 2, 2], theta and eps other than 2B's, so
  nothing can depend on 2B's sizes. Its config.json is the one transformers 5.x writes
  (``rope_parameters``), so that layout is tested too. The patch, temporal patch and merge sizes
  stay the processor's (16, 2, 2), with the real tokenizer, chat template and processor files.
- ``4b``: Qwen3-VL-4B-Instruct's config and index (``files/qwen3-vl-4b-instruct``; bench only, not
  CI), ~17.8 GB of float32 in the hub's two shards under its index's names. transformers would
  hold the whole model in memory to save it (and then some); this writer streams each tensor
  to its shard (``write_sharded``), one tensor in memory at a time.

Weights are N(0, 0.04) everywhere, norm weights 1 + N(0, 0.04): transformers' default init leaves
norms at 1 and biases at 0, and random-but-not-degenerate logits keep greedy argmax free of ties.

The cache (``<repo>/.cache/checkpoints/qwen3-vl-<kind>-<key>/``, ``ffai.bench.checkpoints``'s
layout) keys its folders on ``fingerprint``: this file, the config, the copied files, the seed,
the dtype and the transformers version. torch and transformers are imported inside the
functions that need them.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import inspect
import json
import shutil
from pathlib import Path

from ffai.bench.checkpoints import reinit_
from ffai.errors import ModelError

ENGINE = "qwen3-vl"
FILES = Path(__file__).resolve().parent / "files"  # the real models' small files, shipped with the package
REFERENCE_DIR = FILES / "qwen3-vl-2b-instruct"
# The 4B's files that differ from the 2B's (its others are byte-identical: its SOURCES.md).
REFERENCE_4B_DIR = FILES / "qwen3-vl-4b-instruct"
KINDS = ("2b", "tiny", "4b")  # the first is the bench's checkpoint without --model
INIT_STD = 0.04
COPIED_FILES = (
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "video_preprocessor_config.json",
)

TINY_VISION = {
    "depth": 4,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "num_position_embeddings": 36,
    "deepstack_visual_indexes": [1, 2],
    "out_hidden_size": 64,
}
TINY_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 32768,
}
TINY_ROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True}


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def require_reference_dir() -> Path:
    """The folder of real config and tokenizer files, or a one-line error where it is missing."""
    if not (REFERENCE_DIR / "config.json").is_file():
        raise ModelError(
            f"{REFERENCE_DIR} is missing: the random Qwen3-VL checkpoints are built from the real config "
            f"and tokenizer files there, which ship inside the package"
        )
    return REFERENCE_DIR


def source_dir(kind: str) -> Path:
    """The folder ``kind``'s config, tokenizer and processor files are copied from."""
    if kind != "4b":
        return require_reference_dir()
    if not (REFERENCE_4B_DIR / "model.safetensors.index.json").is_file():
        raise ModelError(f"{REFERENCE_4B_DIR} is missing: the 4B checkpoint is built from the reference files there")
    return REFERENCE_4B_DIR


def copied_from(kind: str, name: str) -> Path:
    """Where ``kind``'s file ``name`` is copied from: the 4B's own folder holds the files that differ."""
    own = source_dir(kind) / name
    return own if own.is_file() else require_reference_dir() / name


def config_dict(kind: str) -> dict:
    """The checkpoint's config.json content for ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {KINDS}")
    real = read_json(source_dir(kind) / "config.json")
    if kind in ("2b", "4b"):
        return real
    tiny = copy.deepcopy(real)
    tiny["vision_config"].update(TINY_VISION)
    text = tiny["text_config"]
    text.update(TINY_TEXT)
    del text["rope_scaling"], text["rope_theta"]
    text["rope_parameters"] = dict(TINY_ROPE)
    return tiny


def build_model(config: dict, seed: int, dtype: str = "float32"):
    """transformers' Qwen3VLForConditionalGeneration for a config.json dict, re-initialised."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_dict(config)).float()
    reinit_(model, seed, INIT_STD)
    return model.to(getattr(torch, dtype)).eval()


def write_checkpoint(kind: str, out: Path | str, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a complete checkpoint folder (weights, config, tokenizer, processors) to ``out``."""
    out = Path(out)
    config = config_dict(kind)
    out.mkdir(parents=True, exist_ok=True)
    if kind == "4b":
        write_sharded(config, out, seed, dtype)
        for name in ("config.json", *COPIED_FILES):
            shutil.copyfile(copied_from(kind, name), out / name)
        return out
    model = build_model(config, seed, dtype)
    model.save_pretrained(out, safe_serialization=True)
    del model
    if kind == "2b":  # the hub's own config.json rather than the re-serialised one
        shutil.copyfile(REFERENCE_DIR / "config.json", out / "config.json")
    for name in COPIED_FILES:
        shutil.copyfile(REFERENCE_DIR / name, out / name)
    return out


def write_sharded(config: dict, out: Path, seed: int, dtype: str) -> None:
    """Random weights for ``config`` written in the hub's shards (its index's names and split)
    in ``dtype``, each tensor drawn and written on its own, as ``reinit_`` draws them: N(0, std),
    norm weights 1 + N(0, std). The safetensors layout is written by hand so that no shard is
    ever whole in memory."""
    import struct

    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from ffai.kit.tensor_files import FILE_DTYPES

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_dict(config))
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    norms = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")
    }
    weight_map = read_json(REFERENCE_4B_DIR / "model.safetensors.index.json")["weight_map"]
    unknown = sorted(set(weight_map) - set(shapes))
    if unknown:
        raise ModelError(f"the 4B index names tensors transformers' model lacks: {unknown[:3]}")
    torch_dtype = getattr(torch, dtype)
    file_dtype = next(name for name, d in FILE_DTYPES.items() if d == torch_dtype)
    gen = torch.Generator().manual_seed(seed)
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    total = 0
    for shard, names in sorted(shards.items()):
        names.sort()
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in names:
            size = torch_dtype.itemsize * int(torch.Size(shapes[name]).numel())
            header[name] = {
                "dtype": file_dtype,
                "shape": list(shapes[name]),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # safetensors pads its header to 8 bytes
        with open(out / shard, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for name in names:
                tensor = torch.randn(shapes[name], generator=gen, dtype=torch.float32).mul_(INIT_STD)
                if name in norms:
                    tensor += 1.0
                f.write(tensor.to(torch_dtype).contiguous().view(torch.uint8).numpy().data)
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def fingerprint(kind: str, seed: int = 0, dtype: str = "float32") -> str:
    """What ``write_checkpoint(kind, …, seed, dtype)`` writes depends on: this file, the config,
    the copied files, the seed, the dtype and the transformers version."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(inspect.getsource(reinit_).encode())  # the shared re-draw writes the weights
    h.update(json.dumps(config_dict(kind), sort_keys=True).encode())
    for name in COPIED_FILES:
        h.update(copied_from(kind, name).read_bytes())
    h.update(f"{seed}/{dtype}/{importlib.metadata.version('transformers')}".encode())
    return h.hexdigest()


def cached_checkpoint(kind: str) -> Path:
    """The cached folder of ``kind``, written first (in this process) when absent: the folder
    ``ffai.bench.checkpoints.checkpoint(kind, "qwen3-vl")`` names once the bench hooks return this
    module's fingerprint, usable before the engine is registered."""
    from ffai.bench.checkpoints import CACHE, place_atomically

    key = hashlib.sha256(f"{ENGINE}/{kind}/{fingerprint(kind)}".encode()).hexdigest()[:12]
    final = CACHE / f"{ENGINE}-{kind}-{key}"
    if final.is_dir():
        return final
    return place_atomically(final, lambda tmp: write_checkpoint(kind, tmp))


# --- the transformers reference on a checkpoint ------------------------------------------------


@functools.cache
def reference_model(path: Path, dtype: str = "float32", attention: str | None = None):
    """transformers' Qwen3VLForConditionalGeneration on a checkpoint, loaded once per process.
    ``attention`` picks transformers' attention implementation (default: its own choice, SDPA)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    extra = {"attn_implementation": attention} if attention else {}
    return Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, dtype), **extra).eval()


@functools.cache
def reference_processor(path: Path):
    """transformers' Qwen3VLProcessor for a checkpoint (its video processor needs torchvision)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)
