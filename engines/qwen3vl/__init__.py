"""The Qwen3-VL engine for ffai: a plain-PyTorch port of transformers' Qwen3-VL, token-identical to it.

This folder, ``engines/qwen3vl``, installs as the package ``ffai_qwen3vl`` (pyproject.toml's
``package-dir``), as ``engines/smolvlm`` installs as ``ffai_smolvlm``. Importing it must stay cheap
(no torch).
"""

from ffai_qwen3vl.engine import ENGINE

__all__ = ["ENGINE"]
