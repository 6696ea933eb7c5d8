"""Random-weight test checkpoints, written once and cached, plus the transformers reference.

A checkpoint lives in ``<repo>/.cache/checkpoints/<kind>-<key>/`` where the key hashes the
writer script, the config it builds, the seed, the dtype and the transformers version, so a
change to any of them writes a fresh one. Writing goes to a temporary folder beside the target,
renamed into place when complete: an aborted run leaves no half checkpoint, and of two parallel
writers the second simply discards its copy.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "make_checkpoint.py"
CACHE = REPO / ".cache" / "checkpoints"


@functools.cache
def writer():
    """scripts/make_checkpoint.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_checkpoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cache_key(kind: str, seed: int, dtype: str) -> str:
    import transformers

    h = hashlib.sha256(SCRIPT.read_bytes())
    h.update(json.dumps(writer().config_dict(kind), sort_keys=True).encode())
    h.update(f"{seed}/{dtype}/{transformers.__version__}".encode())
    return h.hexdigest()[:12]


def checkpoint(kind: str, seed: int = 0, dtype: str = "float32") -> Path:
    """The cached checkpoint folder for ``kind``, written first if absent."""
    final = CACHE / f"{kind}-{cache_key(kind, seed, dtype)}"
    if final.is_dir():
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{kind}-", dir=CACHE))
    try:
        writer().write_checkpoint(kind, tmp, seed=seed, dtype=dtype)
        tmp.chmod(0o755)  # mkdtemp makes it private
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():  # a parallel writer won the rename; anything else is a real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@functools.cache
def reference_model(path: Path, dtype: str = "float32", attention: str | None = None):
    """transformers' Idefics3ForConditionalGeneration on a checkpoint, loaded once per session.
    ``attention`` picks transformers' attention implementation (default: its own choice, SDPA)."""
    import torch
    from transformers import Idefics3ForConditionalGeneration

    extra = {"attn_implementation": attention} if attention else {}
    return Idefics3ForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, dtype), **extra).eval()


@functools.cache
def reference_processor(path: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)
