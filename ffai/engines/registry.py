"""Engines by name, discovered from the entry-point group ``ffai.engines``.

Listing engines loads each plugin object (light: it must not import torch at import time)
but never a model.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from ffai.engines.contract import Engine, EngineInfo
from ffai.errors import FfaiError, ModelError, UsageError

GROUP = "ffai.engines"
DEFAULT_ENGINE = "smolvlm"


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def names() -> list[str]:
    return sorted(_entry_points())


def get_engine(name: str | None = None) -> Engine:
    """The engine registered as ``name`` (the default engine when None)."""
    name = name or DEFAULT_ENGINE
    found = _entry_points().get(name)
    if found is None:
        available = ", ".join(names()) or "none installed"
        raise UsageError(f"no engine named {name!r} (available: {available})")
    try:
        engine = found.load()
    except Exception as e:  # a broken plugin must not take the CLI down with a traceback
        raise FfaiError(f"engine {name!r} failed to load from {found.value}: {e}") from e
    if not isinstance(getattr(engine, "info", None), EngineInfo):
        raise FfaiError(f"engine {name!r} ({found.value}) does not expose an EngineInfo as .info")
    return engine


def engine_infos() -> list[EngineInfo]:
    return [get_engine(name).info for name in names()]


def engine_for_model(name: str | None, model: str | None) -> Engine:
    """The engine a run uses: ``name`` (``--engine``) when given, else the engine the model's
    manifest names, else for a checkpoint folder the engine that declares its config.json's
    ``model_type`` (an engine's optional ``model_types``), else the default engine. A model whose
    manifest names another engine than ``--engine`` is refused in one line, before anything loads,
    unless ``--engine`` declares a ``model_type`` of that engine's (one engine wrapping another)."""
    from ffai import models

    if model and models.looks_like_path(model):
        return get_engine(name or _engine_of_folder(Path(model).expanduser()))
    manifest = models.find_manifest(model) if model else None
    engine = get_engine(name or (manifest.engine if manifest else None))
    if manifest is not None and manifest.engine != engine.info.name and not _same_family(engine, manifest.engine):
        where = models.bundled_dir() / f"{manifest.name}.toml"
        raise ModelError(
            f"{where}: {manifest.name} is a model of the {manifest.engine!r} engine, not of --engine "
            f"{engine.info.name}; leave --engine out or pass --engine {manifest.engine}"
        )
    return engine


def _engine_of_folder(folder: Path) -> str | None:
    """The registered engine whose ``model_types`` hold the folder's config.json ``model_type``;
    None (the default engine, which then says what is wrong) when none does or it cannot be read."""
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return next((n for n in names() if model_type in getattr(get_engine(n), "model_types", ())), None)


def _same_family(engine: Engine, other: str) -> bool:
    """Whether ``engine`` runs the checkpoints of the engine named ``other``: they share a model_type."""
    ours = set(getattr(engine, "model_types", ()))
    return bool(ours & set(getattr(get_engine(other), "model_types", ())))
