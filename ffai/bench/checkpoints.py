"""Random-weight checkpoints for the tests and the bench, written by the engine once and cached.

No real weights are reachable, so the tests and the bench run on checkpoints an engine writes
itself from its bench hooks (``ffai.bench.hooks``): ``write_checkpoint(kind, out)`` for each of
its ``checkpoint_kinds`` (SmolVLM's: ``real``, the SmolVLM-256M shapes, and ``tiny``; see
``ffai.engines.smolvlm.bench.checkpoints``). This module is the engine-neutral cache around them.

A checkpoint lives in ``<repo>/.cache/checkpoints/<engine>-<kind>-<key>/`` (from an installed wheel,
``$FFAI_HOME/checkpoints/``); the key hashes the
engine's ``checkpoint_fingerprint(kind)`` (its writer's code, its config, the library versions
it depends on), so a change to any of them means a fresh folder. The writer runs in a
subprocess, so the caller never imports torch or the reference library. Folders are written
beside their final name and renamed into place, so an aborted run leaves no half checkpoint
and of two parallel writers the second discards its copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ffai.engines.registry import DEFAULT_ENGINE  # the tests' and scripts' checkpoints: SmolVLM's
from ffai.errors import ModelError, UsageError


def source_checkout() -> Path | None:
    """The source checkout ffai runs from (an editable install), or None (an installed wheel)."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / "pyproject.toml").is_file() and (checkout / "ffai" / "bench").is_dir() else None


def _cache() -> Path:
    from ffai.models import ffai_home

    checkout = source_checkout()
    return checkout / ".cache" / "checkpoints" if checkout else ffai_home() / "checkpoints"


CHECKOUT = source_checkout()
CACHE = _cache()


def reinit_(model, seed: int, std: float) -> None:
    """Every tensor of a reference model drawn from one seeded generator: weights N(0, std), norm
    weights 1 + N(0, std) (transformers' init leaves norms at 1 and biases at 0; random but not
    degenerate logits keep greedy argmax free of ties). Engines' writers call it, and hash its
    source into their fingerprint."""
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


def _hooks(kind: str, engine: str):
    from ffai.bench.hooks import hooks_for

    hooks = hooks_for(engine)
    if kind not in hooks.checkpoint_kinds:
        raise ValueError(
            f"unknown checkpoint kind {kind!r} for engine {engine!r}; expected one of {hooks.checkpoint_kinds}"
        )
    return hooks


def checkpoint_key(kind: str, engine: str = DEFAULT_ENGINE) -> str:
    """The cache key: the engine, the kind and the engine's fingerprint of what it would write."""
    fingerprint = _hooks(kind, engine).checkpoint_fingerprint(kind)
    return hashlib.sha256(f"{engine}/{kind}/{fingerprint}".encode()).hexdigest()[:12]


def cache_folder(kind: str, engine: str = DEFAULT_ENGINE) -> Path:
    return CACHE / f"{engine}-{kind}-{checkpoint_key(kind, engine)}"


def place_atomically(final: Path, write) -> Path:
    """``write(tmp)`` into a fresh folder beside ``final``, then renamed into place: an aborted
    run leaves no half-written ``final``, and of two parallel writers the second discards its copy."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():  # a parallel writer won the rename; anything else is a real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# The writer's code for a child process: the caller never imports torch or the reference library.
_WRITE_IN_CHILD = (
    "import sys; from pathlib import Path; from ffai.bench.hooks import hooks_for; "
    "hooks_for(sys.argv[1]).write_checkpoint(sys.argv[2], Path(sys.argv[3]))"
)


def checkpoint(kind: str, engine: str = DEFAULT_ENGINE, log=lambda message: None) -> Path:
    """The cached checkpoint folder of ``engine``'s ``kind``, written first (in a subprocess) when absent."""
    final = cache_folder(kind, engine)
    if final.is_dir():
        return final
    log(f"writing the {engine} {kind} random checkpoint to {final}")

    def write(tmp: Path) -> None:
        cmd = [sys.executable, "-c", _WRITE_IN_CHILD, engine, kind, str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ModelError(f"writing the {engine} {kind} random checkpoint failed: {last}")

    return place_atomically(final, write)


def default_checkpoint(engine: str = DEFAULT_ENGINE, log=lambda message: None) -> Path:
    """The bench's checkpoint without --model: the engine's first kind (SmolVLM's real shapes,
    the same folder the tests use), written first when absent."""
    from ffai.bench.hooks import hooks_for

    kind = hooks_for(engine).checkpoint_kinds[0]
    try:
        final = cache_folder(kind, engine)
    except ModelError as e:
        raise UsageError(f"no --model given, and {e}; pass --model PATH to a {engine} checkpoint") from e
    if final.is_dir():
        return final
    return checkpoint(kind, engine, log)
