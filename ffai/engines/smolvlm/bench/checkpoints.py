"""SmolVLM's random-weight checkpoints for the tests and the bench (``ffai.bench.writer``), built
from the real models' small files shipped in ``files/`` (their ``SOURCES.md`` say where each came from).

SmolVLM (``model_type: idefics3``), two shapes:

- ``real``: the SmolVLM-256M-Instruct config (``files/smolvlm-256m-instruct/config.json``), ~1 GB
  of float32 weights with the real tensor names. The config.json written is the original file
  verbatim (transformers 4.46 format: ``rope_theta`` in ``text_config``), so the loader is tested
  against what the hub holds.
- ``tiny``: the same structure with two layers per tower, small widths and a different tile
  geometry (64 px tiles, 8 px patches, scale factor 2 -> 16 image tokens per tile), so nothing
  can depend on 256M's sizes. Its config.json is the one transformers 5.x writes
  (``rope_parameters``), so that format is tested too.

SmolVLM2 (``model_type: smolvlm``, written with ``SmolVLMForConditionalGeneration`` beside the
SmolVLM2 processor, tokenizer config and chat template of ``files/smolvlm2-500m-video-instruct``):

- ``v2-256m``: SmolVLM2-256M-Video-Instruct, whose config.json is not available: SmolVLM-256M's
  sizes under ``model_type: smolvlm`` (its architecture; files/smolvlm2-500m-video-instruct/SOURCES.md);
- ``v2-500m``: SmolVLM2-500M-Video-Instruct's own config.json (~2 GB of float32);
- ``v2-tiny``: the ``tiny`` shapes with the SmolVLM2 files (64 px tiles, frames first resized to
  a 256 px long edge as the checkpoint's ``size`` says).
"""

from __future__ import annotations

import copy
from pathlib import Path

from ffai.bench.writer import CONFIG_FILE, CheckpointWriter, read_json, shipped, write_json  # noqa: F401 (write_json: scripts)

FILES = Path(__file__).resolve().parent / "files"  # the real models' small files, shipped with the package
REFERENCE_DIR = FILES / "smolvlm-256m-instruct"
V2_DIR = FILES / "smolvlm2-500m-video-instruct"
V2_KINDS = ("v2-256m", "v2-500m", "v2-tiny")
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
# SmolVLM2's own small files (the rest are byte-identical to SmolVLM's: V2_DIR/SOURCES.md).
V2_FILES = ("chat_template.json", "generation_config.json", "special_tokens_map.json", "tokenizer_config.json")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")

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


def require_reference_dir() -> Path:
    return shipped(REFERENCE_DIR, "the random test checkpoints")


def as_smolvlm2(config: dict) -> dict:
    """A SmolVLM config.json as SmolVLM2 names the same architecture."""
    config = copy.deepcopy(config)
    config.update(model_type="smolvlm", architectures=["SmolVLMForConditionalGeneration"])
    config["vision_config"]["model_type"] = "smolvlm_vision"
    return config


def image_seq_len(config: dict) -> int:
    vision = config["vision_config"]
    return (vision["image_size"] // vision["patch_size"]) ** 2 // config["scale_factor"] ** 2


def is_smolvlm2(path: Path) -> bool:
    return read_json(Path(path) / CONFIG_FILE).get("model_type") == "smolvlm"


class SmolVLMWriter(CheckpointWriter):
    kinds = ("real", "tiny", "v2-256m", "v2-500m", "v2-tiny")  # the first is the bench's without --model

    def config(self, kind: str) -> dict:
        self._check(kind)
        real = read_json(require_reference_dir() / CONFIG_FILE)
        if kind == "real":
            return real
        if kind == "v2-500m":
            return read_json(V2_DIR / CONFIG_FILE)
        if kind in V2_KINDS:
            return as_smolvlm2(self.config({"v2-256m": "real", "v2-tiny": "tiny"}[kind]))
        tiny = copy.deepcopy(real)
        tiny["text_config"].update(TINY_TEXT)
        tiny["vision_config"].update(TINY_VISION)
        tiny["scale_factor"] = TINY_SCALE_FACTOR
        tiny["text_config"]["pixel_shuffle_factor"] = TINY_SCALE_FACTOR
        return tiny

    def copied(self, kind: str) -> dict[str, Path]:
        files = {
            name: (V2_DIR if kind in V2_KINDS and name in V2_FILES else require_reference_dir()) / name
            for name in COPIED_FILES
        }
        if kind in ("real", "v2-500m"):  # the hub's own config.json rather than the re-serialised one
            files[CONFIG_FILE] = (V2_DIR if kind == "v2-500m" else REFERENCE_DIR) / CONFIG_FILE
        return files

    def rewritten(self, kind: str, config: dict) -> dict[str, dict]:
        """preprocessor_config.json / processor_config.json, for the tiny kinds' tile geometry."""
        source = V2_DIR if kind in V2_KINDS else require_reference_dir()
        pre, proc = (read_json(source / name) for name in PROCESSOR_FILES)
        if kind in ("tiny", "v2-tiny"):
            pre["max_image_size"] = {"longest_edge": TINY_TILE}
            pre["size"] = {"longest_edge": TINY_LONGEST_EDGE}
            proc["image_seq_len"] = image_seq_len(config)
        return dict(zip(PROCESSOR_FILES, (pre, proc)))

    def model_class(self, config: dict):
        import transformers

        family = "SmolVLM" if config.get("model_type") == "smolvlm" else "Idefics3"
        return getattr(transformers, f"{family}ForConditionalGeneration")

    def processor_options(self, model_dir: Path) -> dict:
        """SmolVLM's processor with its Pillow image processor (the one ffai's SmolVLM path follows,
        and the one transformers builds where torchvision is absent); SmolVLM2's exists only with
        torchvision, so as transformers builds it by default."""
        return {} if is_smolvlm2(model_dir) else {"backend": "pil"}


WRITER = SmolVLMWriter()
