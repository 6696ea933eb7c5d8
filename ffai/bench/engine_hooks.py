"""The bench hooks (``ffai.bench.hooks.BenchHooks``) of an engine built on the kit, made once:
:class:`KitBench` takes the engine's checkpoint writer, its reference arm, its stages and how its
vision stage's output becomes the agreement gate's tiles, and answers the rest the same way for
every engine: the prefill logits and the timed tokens through the kit's text stage, the decode
floor's weights from the kit's text config.

Nothing here imports torch at import time: the bench's parent process stays light.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ffai.bench.transformers_arm import TransformersArm, require
from ffai.bench.writer import CheckpointWriter
from ffai.engines.contract import Request

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ffai.kit.stages import Encoded, EngineStages
    from ffai.run.inline import InlineEngine


def prefill_logits(model: InlineEngine, encoded: Encoded) -> torch.Tensor:
    """(vocab,) the logits the prompt (pictures merged in) gives for the first new token."""
    import torch

    from ffai.kit.generate import prefill

    net = model["text"].net
    with torch.inference_mode():
        prompt = net.prompt(encoded)
        return prefill(net.text, prompt, net.text.reserve_cache(1, prompt.length))[0]


class KitBench:
    """``checkpoint_kinds``, ``check_reference``, ``checkpoint_fingerprint``, ``write_checkpoint``,
    ``reference``, ``features_and_logits``, ``timed_tokens`` and ``decode_weights`` for one engine.
    ``features(model, encoded)`` gives the vision outputs the agreement gate compares, one row per
    tile or picture along dim 0."""

    def __init__(
        self,
        writer: CheckpointWriter,
        arm: type[TransformersArm],
        stages: EngineStages,
        features: Callable[[InlineEngine, Encoded], torch.Tensor],
    ) -> None:
        self.writer, self.arm, self.stages, self.features = writer, arm, stages, features

    @property
    def checkpoint_kinds(self) -> tuple[str, ...]:
        return self.writer.kinds

    def check_reference(self) -> None:
        require(self.arm.packages)

    def checkpoint_fingerprint(self, kind: str) -> str:
        return self.writer.fingerprint(kind)

    def write_checkpoint(self, kind: str, out: Path) -> None:
        self.writer.write(kind, out)

    def reference(self, model_dir: Path, cores: int) -> TransformersArm:
        return self.arm(model_dir, cores)

    def features_and_logits(self, model: InlineEngine, request: Request) -> tuple[torch.Tensor, torch.Tensor]:
        encoded = model.through(request, "vision")
        return self.features(model, encoded), prefill_logits(model, encoded)

    def timed_tokens(self, model: InlineEngine, request: Request) -> tuple[list[int], float, list[float]]:
        """The tokens, the seconds to the first one, and the seconds between each token and the next.

        The pictures' features come first, untimed. Then the kit's ``generate`` with a callback that
        only takes the time: the text stage's ``on_token`` decodes each token to text, and the
        tokenizer's thread pool then spins on the cores the decode step needs."""
        import torch

        from ffai.kit.generate import generate

        encoded = model.through(request, "vision")
        decoder = model["text"]
        stamps: list[float] = []
        start = time.perf_counter()
        with torch.inference_mode():
            prompt = decoder.net.prompt(encoded)
            tokens = generate(
                decoder.net.text,
                prompt,
                encoded.options,
                decoder.stop_ids,
                lambda _: stamps.append(time.perf_counter()),
            )
        return tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]

    def step_seconds(self, model: InlineEngine, request: Request, rows: int, steps: int = 24) -> float:
        """The median seconds of one decode step of ``rows`` sequences together (the request's
        prompt, each in its own cache; one row: the lone step ``generate`` takes)."""
        import statistics

        import torch

        from ffai.kit.generate import decode_one_token, prefill

        encoded = model.through(request, "vision")
        net = model["text"].net
        text = net.text
        times = []
        with torch.inference_mode():
            prompt = net.prompt(encoded)
            caches = [text.new_cache(1, prompt.length + steps) for _ in range(rows)]
            for cache in caches:
                prefill(text, prompt, cache)
            tokens = torch.full((rows,), int(encoded.input_ids[-1]), dtype=torch.long)
            for step in range(steps):
                slot = prompt.length + step
                start = time.perf_counter()
                if rows == 1:
                    decode_one_token(text, tokens, slot, slot + prompt.delta, caches[0])
                else:
                    text.decode_rows(tokens, [(cache, slot, slot + prompt.delta) for cache in caches])
                times.append(time.perf_counter() - start)
        return statistics.median(times[2:])  # the first steps pay for buffers

    def decode_weights(self, model_dir: Path) -> int:
        """How many weights the text tower (embedding table, layers, final norm) and the LM head
        hold, counted from config.json (an int8 model's packed weights are no ``nn.Parameter``)."""
        cfg = self.stages.config.from_dir(Path(model_dir))
        return cfg.text.weights(cfg.tie_word_embeddings)
