"""Write a random-weight SmolVLM (Idefics3) checkpoint with transformers, for tests and the bench.

No real weights are reachable, so the oracle tests compare ffai's port and transformers on a
checkpoint both load from the same files. Two shapes:

- ``real``: the SmolVLM-256M-Instruct config (``tests/data/smolvlm-256m-instruct/config.json``),
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

Usage: python scripts/make_checkpoint.py --config real|tiny --out DIR [--seed 0] [--dtype float32]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO / "tests" / "data" / "smolvlm-256m-instruct"
KINDS = ("real", "tiny")
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


def config_dict(kind: str) -> dict:
    """The checkpoint's config.json content for ``kind`` (a plain dict)."""
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {KINDS}")
    real = read_json(REFERENCE_DIR / "config.json")
    if kind == "real":
        return real
    tiny = copy.deepcopy(real)
    tiny["text_config"].update(TINY_TEXT)
    tiny["vision_config"].update(TINY_VISION)
    tiny["scale_factor"] = TINY_SCALE_FACTOR
    tiny["text_config"]["pixel_shuffle_factor"] = TINY_SCALE_FACTOR
    return tiny


def image_seq_len(config: dict) -> int:
    vision = config["vision_config"]
    return (vision["image_size"] // vision["patch_size"]) ** 2 // config["scale_factor"] ** 2


def processor_files(kind: str, config: dict) -> dict[str, dict]:
    """preprocessor_config.json / processor_config.json, rewritten for the tile geometry."""
    pre = read_json(REFERENCE_DIR / "preprocessor_config.json")
    proc = read_json(REFERENCE_DIR / "processor_config.json")
    if kind == "tiny":
        pre["max_image_size"] = {"longest_edge": TINY_TILE}
        pre["size"] = {"longest_edge": TINY_LONGEST_EDGE}
        proc["image_seq_len"] = image_seq_len(config)
    return {"preprocessor_config.json": pre, "processor_config.json": proc}


def reinit_(model, seed: int, std: float = INIT_STD) -> None:
    """Every tensor drawn from one seeded generator: weights N(0, std), norm weights 1 + N(0, std)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    norm_weights = {
        f"{mod_name}.weight"
        for mod_name, module in model.named_modules()
        if isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")
    }
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            if name in norm_weights:
                noise += 1.0
            param.copy_(noise.to(param.dtype))


def build_model(config: dict, seed: int, dtype: str = "float32"):
    """transformers' Idefics3ForConditionalGeneration for a config.json dict, re-initialised."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    torch.manual_seed(seed)
    # The hub config says torch_dtype bfloat16; build everything in float32, then cast once.
    model = Idefics3ForConditionalGeneration(Idefics3Config.from_dict(config)).float()
    reinit_(model, seed)
    return model.to(getattr(torch, dtype)).eval()


def write_checkpoint(kind: str, out: Path | str, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a complete checkpoint folder (weights, config, tokenizer, processor) to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = config_dict(kind)
    model = build_model(config, seed, dtype)
    model.save_pretrained(out, safe_serialization=True)
    if kind == "real":
        # Keep the hub's own config.json (transformers 4.46 format) rather than the re-serialised one.
        shutil.copyfile(REFERENCE_DIR / "config.json", out / "config.json")
    for name in COPIED_FILES:
        shutil.copyfile(REFERENCE_DIR / name, out / name)
    for name, data in processor_files(kind, config).items():
        write_json(out / name, data)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=KINDS, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    path = write_checkpoint(args.config, args.out, seed=args.seed, dtype=args.dtype)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
