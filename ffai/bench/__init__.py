"""`ffai bench vlm`: ffai's engine against its reference implementation, same checkpoint and inputs.

- ``hooks``: what an engine provides to be benched (``bench = "module:attr"`` on the engine):
  its reference arm, its random checkpoints, its probes. SmolVLM's: ``ffai.engines.smolvlm.bench``.
- ``cases``: the inputs (frame, still, window, clip), the decoding budget, the quality items.
- ``checkpoints``: the random-weight checkpoints the bench and the tests share (the bench's
  default), written by the engine's hooks and cached in ``.cache/checkpoints/``.
- ``arms``: the two arms, each run in a fresh subprocess (``python -m ffai.bench.arms``).
- ``agreement``: the untimed precision run per case (``python -m ffai.bench.agreement``): ffai
  in the bench's dtype against ffai in float32, decode time per token against the memory floor.
- ``gates``: the schedule (ABBA), per-case summaries and the four gates.
- ``ledger``: one JSON line per run, appended.
- ``cli``: the ``bench_app`` typer app with the ``vlm`` command.

Nothing here imports torch or transformers at module import. What only tests and scripts use (sample
clips, live streams on loopback, the media fuzzer) lives in ``scripts/``, not in the installed package.
"""

from __future__ import annotations
