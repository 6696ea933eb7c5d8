"""Model manifests (``*.toml``) shipped with ffai, installed as the package ``ffai_models``."""
