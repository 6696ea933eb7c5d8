"""Qwen3-VL's random-weight checkpoints for the tests and the bench (``ffai.bench.writer``), built
from the real models' small files shipped in ``files/`` (their ``SOURCES.md`` say where each came from):

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
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ffai.bench.writer import CONFIG_FILE, CheckpointWriter, read_json, shipped
from ffai.errors import ModelError

FILES = Path(__file__).resolve().parent / "files"  # the real models' small files, shipped with the package
REFERENCE_DIR = FILES / "qwen3-vl-2b-instruct"
# The 4B's files that differ from the 2B's (its others are byte-identical: its SOURCES.md).
REFERENCE_4B_DIR = FILES / "qwen3-vl-4b-instruct"
INDEX_FILE = "model.safetensors.index.json"
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


def require_reference_dir() -> Path:
    return shipped(REFERENCE_DIR, "the random Qwen3-VL checkpoints")


def copied_from(kind: str, name: str) -> Path:
    """Where ``kind``'s file ``name`` comes from: the 4B's own folder holds the files that differ."""
    own = REFERENCE_4B_DIR / name
    return own if kind == "4b" and own.is_file() else require_reference_dir() / name


class Qwen3VLWriter(CheckpointWriter):
    kinds = ("2b", "tiny", "4b")  # the first is the bench's checkpoint without --model

    def config(self, kind: str) -> dict:
        self._check(kind)
        real = read_json(copied_from(kind, CONFIG_FILE))
        if kind in ("2b", "4b"):
            return real
        tiny = copy.deepcopy(real)
        tiny["vision_config"].update(TINY_VISION)
        text = tiny["text_config"]
        text.update(TINY_TEXT)
        del text["rope_scaling"], text["rope_theta"]
        text["rope_parameters"] = dict(TINY_ROPE)
        return tiny

    def copied(self, kind: str) -> dict[str, Path]:
        files = {name: copied_from(kind, name) for name in COPIED_FILES}
        if kind in ("2b", "4b"):  # the hub's own config.json rather than the re-serialised one
            files[CONFIG_FILE] = copied_from(kind, CONFIG_FILE)
        return files

    def model_class(self, config: dict):
        from transformers import Qwen3VLForConditionalGeneration

        return Qwen3VLForConditionalGeneration

    def write_weights(self, kind: str, config: dict, out: Path, seed: int, dtype: str) -> None:
        if kind == "4b":
            write_sharded(config, out, seed, dtype, self.init_std)
        else:
            super().write_weights(kind, config, out, seed, dtype)


def write_sharded(config: dict, out: Path, seed: int, dtype: str, std: float) -> None:
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
    weight_map = read_json(REFERENCE_4B_DIR / INDEX_FILE)["weight_map"]
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
                tensor = torch.randn(shapes[name], generator=gen, dtype=torch.float32).mul_(std)
                if name in norms:
                    tensor += 1.0
                f.write(tensor.to(torch_dtype).contiguous().view(torch.uint8).numpy().data)
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


WRITER = Qwen3VLWriter()
