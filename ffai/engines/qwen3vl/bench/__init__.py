"""Qwen3-VL's bench hooks (``ffai.bench.hooks.BenchHooks``), named by ``Qwen3VLEngine.bench``:
random-weight Qwen3-VL checkpoints written with transformers (``checkpoints``), transformers as
the reference arm (``reference``), and the probes of the agreement run (``probes``).

Only this package (and the tests) may import transformers; it does so inside the calls that need
it, so importing the hooks stays light.
"""

from __future__ import annotations

from pathlib import Path

from ffai.engines.qwen3vl.bench import checkpoints, probes
from ffai.engines.qwen3vl.bench.reference import ReferenceArm, require_transformers


class Qwen3VLBench:
    checkpoint_kinds = checkpoints.KINDS

    def check_reference(self) -> None:
        require_transformers()

    def checkpoint_fingerprint(self, kind: str) -> str:
        return checkpoints.fingerprint(kind)

    def write_checkpoint(self, kind: str, out: Path) -> None:
        checkpoints.write_checkpoint(kind, out)

    def reference(self, model_dir: Path, cores: int) -> ReferenceArm:
        return ReferenceArm(model_dir, cores)

    features_and_logits = staticmethod(probes.features_and_logits)
    timed_tokens = staticmethod(probes.timed_tokens)
    decode_weights = staticmethod(probes.text_weights)


HOOKS = Qwen3VLBench()
