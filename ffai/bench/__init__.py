"""`ffai bench vlm`: ffai's engine against the transformers reference, same checkpoint and inputs.

- ``cases``: the inputs (frame, still, window, clip), the decoding budget, the default checkpoint.
- ``arms``: the two arms, each run in a fresh subprocess (``python -m ffai.bench.arms``).
- ``gates``: the schedule (ABBA), per-case summaries and the four gates.
- ``ledger``: one JSON line per run, appended.
- ``cli``: the ``bench_app`` typer app with the ``vlm`` command.

Nothing here imports torch or transformers at module import.
"""

from __future__ import annotations
