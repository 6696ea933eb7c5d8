"""What `ffai bench vlm` needs from an engine beyond the engine contract: its bench hooks.

An engine object MAY carry ``bench = "module:attr"``, a string so that the plugin stays light
(``ffai engines`` imports it); the bench resolves it here (``hooks_for``) into an object with
the :class:`BenchHooks` members. The bench's own parts (cases, schedule, gates, ledger, cosine,
bandwidth and floor arithmetic, the checkpoint cache) stay engine-neutral in ``ffai.bench``.
SmolVLM's hooks live in ``ffai.engines.smolvlm.bench`` (ffai/engines/smolvlm/bench/); the palette test engine
(tests/minimal_engine.py) shows the least an engine needs.

Nothing here imports torch; a hook imports what it needs inside its calls, so the bench's parent
process stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ffai.engines.contract import DecodingOptions, Engine, Request
from ffai.errors import FfaiError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ffai.run.inline import InlineEngine


class ReferenceArm(Protocol):
    """An implementation independent of the engine's, asked what ffai's arm is asked (float32).
    ``item``: a ``ffai.bench.cases.Item`` or ``QualityItem`` (``.id``, ``.images``, ``.times``,
    ``.still``, ``.request(options)``). Built cheaply; ``load`` does the untimed loading."""

    name: str  # "reference"

    def load(self) -> None: ...

    def answer(self, item, options: DecodingOptions) -> tuple[list[int], str]:
        """The tokens ffai's arm would give (without a final stop token) and their text."""

    def answer_all(self, items: list, options: list[DecodingOptions]) -> dict[str, tuple[list[int], str]]: ...

    def clip(self, path: Path) -> dict[str, list[int]]:
        """Each window of ``ffai.bench.cases.clip_items(path)`` by its id: its tokens."""

    # Optional: ``clip_batched(path, batch)``, the same windows ``batch`` at a time in one padded
    # batch; when an arm has it, ``ffai bench vlm --batch N`` runs the clip case against it too.

    def info(self) -> dict:
        """What the report keeps about this arm, e.g. ``{"torch_threads": {"main": 2}}``."""

    def close(self) -> None: ...


class BenchHooks(Protocol):
    # Random-weight checkpoints the engine can write; the first is the bench's without --model.
    checkpoint_kinds: tuple[str, ...]

    def check_reference(self) -> None:
        """Raise a one-line FfaiError when the reference cannot run here (a missing package);
        called before anything else runs."""

    def checkpoint_fingerprint(self, kind: str) -> str:
        """Changes whenever what ``write_checkpoint(kind, …)`` writes would change (the writer's
        code, its config, a library version); ``ffai.bench.checkpoints`` keys its cache on it.
        Cheap: imports no torch."""

    def write_checkpoint(self, kind: str, out: Path) -> None:
        """Write a complete checkpoint of ``kind`` into the empty folder ``out`` (the cache runs
        it in a subprocess and renames the folder into place)."""

    def reference(self, model_dir: Path, cores: int) -> ReferenceArm:
        """The reference arm on ``model_dir``, to use ``cores`` cores."""

    def features_and_logits(self, model: "InlineEngine", request: Request) -> tuple["torch.Tensor", "torch.Tensor"]:
        """The image features (one row per tile or picture along dim 0; the agreement gate takes
        a cosine per row) and the logits of the first new token, from the engine's stages."""

    def timed_tokens(self, model: "InlineEngine", request: Request) -> tuple[list[int], float, list[float]]:
        """The answer's tokens, the seconds from the images' features to the first token, and
        the seconds between each token and the next."""

    def decode_weights(self, model_dir: Path) -> int:
        """How many weights one decode step reads (the decode floor's numerator)."""


def hooks_for(engine: str | Engine | None = None) -> BenchHooks:
    """The bench hooks of ``engine`` (a registered name, None for the default, or the object),
    or a one-line UsageError when it provides none."""
    from ffai.engines import registry
    from ffai.pipeline.config import resolve

    found = engine if engine is not None and not isinstance(engine, str) else registry.get_engine(engine)
    name = found.info.name
    ref = getattr(found, "bench", None)
    if ref is None:
        raise UsageError(f"engine {name!r} provides no bench hooks")
    try:
        return resolve(ref)
    except (ImportError, AttributeError, ValueError) as e:
        raise FfaiError(f"engine {name!r}: its bench hooks {ref!r} failed to load: {e}") from e
