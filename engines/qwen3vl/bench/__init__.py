"""Qwen3-VL's hooks for ``ffai bench vlm`` and the tests: the transformers reference and random-weight
checkpoints (the only place transformers is imported)."""
