"""The SmolVLM (Idefics3) engine for ffai: a plain-PyTorch port, token-identical to transformers.

This folder, ``ffai/engines/smolvlm``, installs as the package ``ffai.engines.smolvlm`` (pyproject.toml's
``package-dir``): engines are imported by a name of their own, as a third-party engine would be.

Importing this package is cheap (no torch): ``ENGINE`` answers ``ffai engines``; the stages
(``ffai.engines.smolvlm.stages``) load the model only when the pipeline builds them.
"""

from ffai.engines.smolvlm.engine import ENGINE

__all__ = ["ENGINE"]
