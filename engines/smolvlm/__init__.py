"""The SmolVLM (Idefics3) engine for ffai: a plain-PyTorch port, token-identical to transformers.

Importing this package is cheap (no torch): ``ENGINE`` answers ``ffai engines`` and loads
the model only when asked.
"""

from ffai_smolvlm.engine import ENGINE

__all__ = ["ENGINE"]
