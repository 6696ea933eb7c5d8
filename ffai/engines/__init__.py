"""Engines: the contract the core relies on (``contract``), the registry that finds engines by
name through the ``ffai.engines`` entry points (``registry``), and the engines ffai ships, one
folder per family, each holding its architecture only (``smolvlm``, ``qwen3vl``).

Importing this package or an engine's package is cheap (no torch): ``ffai engines`` lists them.
"""
