"""SmolVLM's bench hooks (``ffai.bench.hooks.BenchHooks``), named by ``SmolVLMEngine.bench``:
random-weight Idefics3 checkpoints written with transformers (``checkpoints``) and transformers as
the reference arm (``reference``), over the kit's hooks (``ffai.bench.engine_hooks``): the agreement
gate compares each tile's image embeddings.

Only this package (and the tests) may import transformers; it does so inside the calls that need
it, so importing the hooks stays light.
"""

from __future__ import annotations

from ffai.bench.engine_hooks import KitBench
from ffai.engines.smolvlm.bench.checkpoints import WRITER
from ffai.engines.smolvlm.bench.reference import ReferenceArm
from ffai.engines.smolvlm.stages import STAGES


def image_embeds(model, encoded):
    """(n_tiles, image_seq_len, D): the vision tower + connector output of every tile."""
    return encoded.visual


HOOKS = KitBench(WRITER, ReferenceArm, STAGES, image_embeds)
