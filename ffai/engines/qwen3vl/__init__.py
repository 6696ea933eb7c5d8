"""The Qwen3-VL engine for ffai: a plain-PyTorch port of transformers' Qwen3-VL, token-identical to it.

This folder, ``ffai/engines/qwen3vl``, installs as the package ``ffai.engines.qwen3vl`` (pyproject.toml's
``package-dir``), as ``ffai/engines/smolvlm`` installs as ``ffai.engines.smolvlm``. Importing it must stay cheap
(no torch).
"""

from ffai.engines.qwen3vl.engine import ENGINE

__all__ = ["ENGINE"]
