"""Random-weight SmolVLM and SmolVLM2 checkpoints for the tests and the bench, written with
transformers (``ffai.bench.checkpoints`` caches them), plus the transformers reference loaded on them.

No real weights are reachable, so the oracle tests compare ffai's port and transformers on a
checkpoint both load from the same files. SmolVLM (``model_type: idefics3``), two shapes:

- ``real``: the SmolVLM-256M-Instruct config (``files/smolvlm-256m-instruct/config.json``),
  ~1 GB of float32 weights with the real tensor names. The config.json written is the original
  file verbatim (transformers 4.46 format: ``rope_theta`` in ``text_config``), so the loader is
  tested against what the hub holds.
- ``tiny``: the same structure with two layers per tower, small widths and a different tile
  geometry (64 px tiles, 8 px patches, scale factor 2 -> 16 image tokens per tile), so nothing
  can depend on 256M's sizes. Its config.json is the one transformers 5.x writes
  (``rope_parameters``), so that format is tested too.

Weights are re-initialised from one seed with a normal distribution on every tensor (norm
weights around 1): transformers' default init leaves norms at exactly 1 and biases at 0, and
random-but-not-degenerate logits keep greedy argmax free of ties.

SmolVLM2 (``model_type: smolvlm``, written with ``SmolVLMForConditionalGeneration`` beside the
SmolVLM2 processor, tokenizer config and chat template of ``files/smolvlm2-500m-video-instruct``):

- ``v2-256m``: SmolVLM2-256M-Video-Instruct, whose config.json is not available: SmolVLM-256M's
  sizes under ``model_type: smolvlm`` (its architecture; files/smolvlm2-500m-video-instruct/SOURCES.md);
- ``v2-500m``: SmolVLM2-500M-Video-Instruct's own config.json (~2 GB of float32);
- ``v2-tiny``: the ``tiny`` shapes with the SmolVLM2 files (64 px tiles, frames first resized to
  a 256 px long edge as the checkpoint's ``size`` says).

The cache (``<repo>/.cache/checkpoints/smolvlm-<kind>-<key>/``) keys its folders on
``fingerprint``: this file, the config, the seed, the dtype and the transformers version, so a
change to any of them means a fresh folder.

The config and tokenizer files come from ``files/smolvlm-256m-instruct``, which ships inside the
package. torch and transformers are imported inside the functions that need them.
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

FILES = Path(__file__).resolve().parent / "files"  # the real models' small files, shipped with the package
REFERENCE_DIR = FILES / "smolvlm-256m-instruct"
V2_DIR = FILES / "smolvlm2-500m-video-instruct"
KINDS = ("real", "tiny", "v2-256m", "v2-500m", "v2-tiny")  # the first is the bench's checkpoint without --model
V2_KINDS = ("v2-256m", "v2-500m", "v2-tiny")
# SmolVLM2's own small files (the rest are byte-identical to SmolVLM's: V2_DIR/SOURCES.md).
V2_FILES = (
    "chat_template.json",
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
)
INIT_STD = 0.04

# Copied unchanged next to the weights (tokenizer, chat template, generation defaults).
COPIED_FILES = (
    "added_tokens.json",
    "chat_template.json",
    "generation_config.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
)

# Tiny shapes: two layers per tower, GQA kept (4 heads over 2 kv heads), rope_theta and eps
# differ from 256M so a hard-coded value would show.
TINY_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-6,
}
TINY_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "patch_size": 8,
    "image_size": 64,
    "layer_norm_eps": 1e-5,
    "max_image_size": {"longest_edge": 64},
    "size": {"longest_edge": 256},
}
TINY_SCALE_FACTOR = 2
TINY_TILE = 64  # preprocessor max_image_size.longest_edge
TINY_LONGEST_EDGE = 256  # preprocessor size.longest_edge


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def require_reference_dir() -> Path:
    """The folder of real config and tokenizer files, or a one-line error where it is missing."""
    if not (REFERENCE_DIR / "config.json").is_file():
        raise ModelError(
            f"{REFERENCE_DIR} is missing: the random test checkpoints are built from the real config and "
            f"tokenizer files there, which ship inside the package"
        )
    return REFERENCE_DIR


def config_dict(kind: str) -> dict:
    """The checkpoint's config.json content for ``kind`` (a plain dict)."""
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {KINDS}")
    real = read_json(require_reference_dir() / "config.json")
    if kind == "real":
        return real
    if kind == "v2-500m":
        return read_json(V2_DIR / "config.json")
    if kind in V2_KINDS:
        return as_smolvlm2(config_dict({"v2-256m": "real", "v2-tiny": "tiny"}[kind]))
    tiny = copy.deepcopy(real)
    tiny["text_config"].update(TINY_TEXT)
    tiny["vision_config"].update(TINY_VISION)
    tiny["scale_factor"] = TINY_SCALE_FACTOR
    tiny["text_config"]["pixel_shuffle_factor"] = TINY_SCALE_FACTOR
    return tiny


def as_smolvlm2(config: dict) -> dict:
    """A SmolVLM config.json as SmolVLM2 names the same architecture."""
    config = copy.deepcopy(config)
    config.update(model_type="smolvlm", architectures=["SmolVLMForConditionalGeneration"])
    config["vision_config"]["model_type"] = "smolvlm_vision"
    return config


def image_seq_len(config: dict) -> int:
    vision = config["vision_config"]
    return (vision["image_size"] // vision["patch_size"]) ** 2 // config["scale_factor"] ** 2


def processor_files(kind: str, config: dict) -> dict[str, dict]:
    """preprocessor_config.json / processor_config.json, rewritten for the tile geometry."""
    source = V2_DIR if kind in V2_KINDS else REFERENCE_DIR
    pre = read_json(source / "preprocessor_config.json")
    proc = read_json(source / "processor_config.json")
    if kind in ("tiny", "v2-tiny"):
        pre["max_image_size"] = {"longest_edge": TINY_TILE}
        pre["size"] = {"longest_edge": TINY_LONGEST_EDGE}
        proc["image_seq_len"] = image_seq_len(config)
    return {"preprocessor_config.json": pre, "processor_config.json": proc}


def build_model(config: dict, seed: int, dtype: str = "float32"):
    """transformers' Idefics3ForConditionalGeneration for a config.json dict, re-initialised."""
    import torch
    import transformers

    family = "SmolVLM" if config["model_type"] == "smolvlm" else "Idefics3"
    config_class = getattr(transformers, f"{family}Config")
    model_class = getattr(transformers, f"{family}ForConditionalGeneration")
    torch.manual_seed(seed)
    # The hub config says torch_dtype bfloat16; build everything in float32, then cast once.
    model = model_class(config_class.from_dict(config)).float()
    reinit_(model, seed, INIT_STD)
    return model.to(getattr(torch, dtype)).eval()


def write_checkpoint(kind: str, out: Path | str, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a complete checkpoint folder (weights, config, tokenizer, processor) to ``out``."""
    out = Path(out)
    config = config_dict(kind)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(config, seed, dtype)
    model.save_pretrained(out, safe_serialization=True)
    if kind in ("real", "v2-500m"):
        # Keep the hub's own config.json (transformers 4.4x format) rather than the re-serialised one.
        shutil.copyfile((V2_DIR if kind == "v2-500m" else REFERENCE_DIR) / "config.json", out / "config.json")
    for name in COPIED_FILES:
        source = V2_DIR if kind in V2_KINDS and name in V2_FILES else REFERENCE_DIR
        shutil.copyfile(source / name, out / name)
    for name, data in processor_files(kind, config).items():
        write_json(out / name, data)
    return out


def fingerprint(kind: str, seed: int = 0, dtype: str = "float32") -> str:
    """What ``write_checkpoint(kind, …, seed, dtype)`` writes depends on: this file (the writer),
    the config it builds, the seed, the dtype and the transformers version."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(inspect.getsource(reinit_).encode())  # the shared re-draw writes the weights
    h.update(json.dumps(config_dict(kind), sort_keys=True).encode())
    if kind in V2_KINDS:  # its files are copied, not derived from the config
        for name in ("preprocessor_config.json", "processor_config.json", *V2_FILES):
            h.update((V2_DIR / name).read_bytes())
    h.update(f"{seed}/{dtype}/{importlib.metadata.version('transformers')}".encode())
    return h.hexdigest()


# --- the transformers reference on a checkpoint ------------------------------------------------


@functools.cache
def reference_model(path: Path, dtype: str = "float32", attention: str | None = None):
    """transformers' Idefics3ForConditionalGeneration (SmolVLMForConditionalGeneration for a
    SmolVLM2 checkpoint) on a checkpoint, loaded once per process. ``attention`` picks
    transformers' attention implementation (default: its own choice, SDPA)."""
    import torch

    extra = {"attn_implementation": attention} if attention else {}
    return model_class(path).from_pretrained(path, dtype=getattr(torch, dtype), **extra).eval()


def is_smolvlm2(path: Path) -> bool:
    return read_json(Path(path) / "config.json").get("model_type") == "smolvlm"


def model_class(path: Path):
    import transformers

    return (
        transformers.SmolVLMForConditionalGeneration
        if is_smolvlm2(path)
        else transformers.Idefics3ForConditionalGeneration
    )


def processor_options(path: Path) -> dict:
    """How the reference processor is built: SmolVLM's with its Pillow image processor (the one
    ffai's SmolVLM path follows, and the one transformers builds where torchvision is absent);
    SmolVLM2's exists only with torchvision, so as transformers builds it by default."""
    return {} if is_smolvlm2(path) else {"backend": "pil"}


@functools.cache
def reference_processor(path: Path):
    """transformers' processor for a checkpoint, loaded once per process."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, **processor_options(path))
