"""The caption run: what ``-i`` names, sampled into windows, asked of the engine's stages, and the
answers put back in timeline order as cues.

``options`` (what a run is asked to do) → ``inputs`` (files, folders, globs, lists) →
``window_source`` (decoded samples → windows → requests) → ``captioner`` (the engine's stages
placed inline or in worker processes; ``live`` for live sources) → cues; ``jobs`` drives a
corpus and is the one writer of its outputs and of its run record (``runlog``).
"""
