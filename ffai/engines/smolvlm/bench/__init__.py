"""SmolVLM's bench hooks (``ffai.bench.hooks.BenchHooks``), named by ``SmolVLMEngine.bench``:
random-weight Idefics3 checkpoints written with transformers (``checkpoints``), transformers as
the reference arm (``reference``), and the probes of the precision run (``probes``).

Only this package (and the tests) may import transformers; it does so inside the calls that need
it, so importing the hooks stays light.
"""

from __future__ import annotations

from pathlib import Path

from ffai.engines.smolvlm.bench import checkpoints, probes
from ffai.engines.smolvlm.bench.reference import ReferenceArm, require_transformers


class SmolVLMBench:
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


HOOKS = SmolVLMBench()
