"""How an engine writes its random-weight checkpoints with transformers, for the tests and the bench:
one :class:`CheckpointWriter` skeleton, subclassed by each engine's bench with its kinds, its
configs and the real model files it copies (shipped in its ``files/`` folder).

No real weights are reachable, so the oracle tests and the bench compare ffai's port and
transformers on a checkpoint both load from the same files, written by transformers'
``save_pretrained`` with every tensor re-drawn from one seed (``reinit_``): weights N(0, std), norm
weights 1 + N(0, std); transformers' init leaves norms at 1 and biases at 0, and random but not
degenerate logits keep greedy argmax free of ties. ``ffai.bench.checkpoints`` caches what a writer
writes, keyed on its :meth:`~CheckpointWriter.fingerprint`.

torch and transformers are imported inside the methods that need them: a writer imports cheaply.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import importlib.metadata
import inspect
import json
import shutil
from pathlib import Path

from ffai.bench.checkpoints import reinit_
from ffai.errors import ModelError

CONFIG_FILE = "config.json"


def shipped(folder: Path, what: str) -> Path:
    """``folder`` of a real model's small files, or a one-line error where it is missing."""
    if not (folder / CONFIG_FILE).is_file():
        raise ModelError(
            f"{folder} is missing: {what} are built from the real config and tokenizer files there, "
            "which ship inside the package"
        )
    return folder


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


class CheckpointWriter(abc.ABC):
    """An engine's random-weight checkpoints: ``kinds`` (the first is the bench's checkpoint
    without ``--model``), each kind's config.json and the files copied beside its weights."""

    kinds: tuple[str, ...]
    init_std = 0.04

    @abc.abstractmethod
    def config(self, kind: str) -> dict:
        """The checkpoint's config.json content for ``kind``."""

    @abc.abstractmethod
    def copied(self, kind: str) -> dict[str, Path]:
        """The files copied beside ``kind``'s weights, by name (tokenizer, templates, processor
        configs; config.json where the hub's own file is kept verbatim rather than re-serialised)."""

    @abc.abstractmethod
    def model_class(self, config: dict):
        """transformers' model class for a config.json dict (imported here)."""

    def config_class(self, config: dict):
        """transformers' config class for a config.json dict."""
        return self.model_class(config).config_class

    def rewritten(self, kind: str, config: dict) -> dict[str, dict]:
        """JSON files written for ``kind`` (a tiny kind's processor geometry), by name."""
        return {}

    def processor_options(self, model_dir: Path) -> dict:
        """How the reference processor is built for a checkpoint (``AutoProcessor`` options)."""
        return {}

    def build_model(self, config: dict, seed: int, dtype: str = "float32"):
        """transformers' model for a config.json dict, re-initialised from ``seed``."""
        import torch

        torch.manual_seed(seed)
        # A hub config may say bfloat16: build everything in float32, then cast once.
        model = self.model_class(config)(self.config_class(config).from_dict(config)).float()
        reinit_(model, seed, self.init_std)
        return model.to(getattr(torch, dtype)).eval()

    def write_weights(self, kind: str, config: dict, out: Path, seed: int, dtype: str) -> None:
        model = self.build_model(config, seed, dtype)
        model.save_pretrained(out, safe_serialization=True)

    def write(self, kind: str, out: Path | str, seed: int = 0, dtype: str = "float32") -> Path:
        """Write a complete checkpoint folder (weights, config, tokenizer, processors) to ``out``."""
        self._check(kind)
        out = Path(out)
        config = self.config(kind)
        out.mkdir(parents=True, exist_ok=True)
        self.write_weights(kind, config, out, seed, dtype)
        for name, source in self.copied(kind).items():
            shutil.copyfile(source, out / name)
        for name, data in self.rewritten(kind, config).items():
            write_json(out / name, data)
        return out

    def fingerprint(self, kind: str, seed: int = 0, dtype: str = "float32") -> str:
        """What ``write(kind, …, seed, dtype)`` writes depends on: the writer's code (this module and
        the engine's), the config, the copied and rewritten files, the seed, the dtype and the
        transformers version. Cheap: imports no torch."""
        self._check(kind)
        h = hashlib.sha256(Path(__file__).read_bytes())
        h.update(Path(inspect.getfile(type(self))).read_bytes())
        h.update(inspect.getsource(reinit_).encode())  # the shared re-draw writes the weights
        config = self.config(kind)
        h.update(json.dumps(config, sort_keys=True).encode())
        for name, source in sorted(self.copied(kind).items()):
            h.update(name.encode() + source.read_bytes())
        h.update(json.dumps(self.rewritten(kind, config), sort_keys=True).encode())
        h.update(f"{seed}/{dtype}/{importlib.metadata.version('transformers')}".encode())
        return h.hexdigest()

    def reference_model(self, path: Path, dtype: str = "float32", attention: str | None = None):
        """transformers' model on a checkpoint, loaded once per process. ``attention`` picks
        transformers' attention implementation (default: its own choice, SDPA)."""
        return _reference_model(self, Path(path), dtype, attention)

    def reference_processor(self, path: Path):
        """transformers' processor for a checkpoint, loaded once per process."""
        return _reference_processor(self, Path(path))

    def _check(self, kind: str) -> None:
        if kind not in self.kinds:
            raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {self.kinds}")


@functools.cache
def _reference_model(writer: CheckpointWriter, path: Path, dtype: str, attention: str | None):
    import torch

    extra = {"attn_implementation": attention} if attention else {}
    model_class = writer.model_class(read_json(path / CONFIG_FILE))
    return model_class.from_pretrained(path, dtype=getattr(torch, dtype), **extra).eval()


@functools.cache
def _reference_processor(writer: CheckpointWriter, path: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, **writer.processor_options(path))


def release_references() -> None:
    """Drop the reference models and processors loaded so far (a large one held for nothing)."""
    _reference_model.cache_clear()
    _reference_processor.cache_clear()
