"""Write a random-weight checkpoint at SmolVLM2-2.2B-Instruct's shapes, for the bench (speed and memory).

    python scripts/make_smolvlm2_2b_checkpoint.py --out DIR [--seed 0]

The 2.2B's config.json and processor files are not available here (../shared/reference/
smolvlm2-2.2b-instruct/SOURCES.md), so its sizes are rebuilt: a SigLIP-SO400M tower (1152 wide,
27 layers, 16 heads, 14 px patches, 384 px tiles), SmolLM2-1.7B's text tower (2048 wide, 24 layers,
32 heads and 32 KV heads), a pixel shuffle of 3 (81 image tokens a tile) and an untied LM head. The
model this builds has exactly the 2,246,784,880 parameters the hub manifest gives for the real one,
which the script checks before writing. What a parameter count cannot confirm (rope theta, norm
epsilon, the processor's sizes: 384 px tiles, stills first scaled to a 1536 px long edge, frames to
384) changes rounding or tiling, not the cost of a tile or a token. The tokenizer, chat template and
generation config are SmolVLM2-500M-Video's, which the 2.2B's hashes say are byte-identical.
Needs transformers (the [reference] extra) and a source checkout; ~9 GB of float32 on disk.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
from pathlib import Path

from ffai.engines.smolvlm.bench import checkpoints

PARAMETERS = 2_246_784_880  # the hub manifest's count for SmolVLM2-2.2B-Instruct (SOURCES.md)
TEXT = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 64,
    "rope_theta": 130000,
}
VISION = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "patch_size": 14,
    "image_size": 384,
    "max_image_size": {"longest_edge": 384},
    "size": {"longest_edge": 1536},
}
SCALE_FACTOR = 3
TILE, LONGEST_EDGE = 384, 1536


def config_2b() -> dict:
    config = copy.deepcopy(checkpoints.read_json(checkpoints.V2_DIR / "config.json"))
    config["text_config"].update(TEXT)
    config["text_config"]["pixel_shuffle_factor"] = SCALE_FACTOR
    config["vision_config"].update(VISION)
    config["scale_factor"] = SCALE_FACTOR
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = config_2b()
    model = checkpoints.WRITER.build_model(config, args.seed)
    count = sum(p.numel() for p in model.parameters())
    if count != PARAMETERS:
        print(f"make_smolvlm2_2b_checkpoint: error: {count} parameters, not {PARAMETERS}", file=sys.stderr)
        return 1
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    del model
    checkpoints.write_json(out / "config.json", config)
    for name in checkpoints.COPIED_FILES:
        source = checkpoints.V2_DIR if name in checkpoints.V2_FILES else checkpoints.REFERENCE_DIR
        shutil.copyfile(source / name, out / name)
    pre = checkpoints.read_json(checkpoints.V2_DIR / "preprocessor_config.json")
    pre["max_image_size"] = {"longest_edge": TILE}
    pre["size"] = {"longest_edge": LONGEST_EDGE}
    pre["video_sampling"]["video_size"] = {"longest_edge": TILE}
    checkpoints.write_json(out / "preprocessor_config.json", pre)
    proc = checkpoints.read_json(checkpoints.V2_DIR / "processor_config.json")
    proc["image_seq_len"] = checkpoints.image_seq_len(config)
    checkpoints.write_json(out / "processor_config.json", proc)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
