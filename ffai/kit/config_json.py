"""Typed reads of a checkpoint's JSON files (config.json, generation and processor configs), for
every engine: each error is one ModelError line naming the file and the key path."""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import Any

from ffai.errors import ModelError

CONFIG_FILE = "config.json"
_MISSING = object()


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a file of the model folder holding its ``what``), or a
    one-line ModelError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ModelError(f"{path}: no {path.name} in the model folder") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: cannot read {what}: {e}") from e
    if not isinstance(data, dict):
        raise ModelError(f"{path}: {what} must be a JSON object")
    return data


class JsonSection:
    """Typed reads from one dict of a JSON file, with errors naming the file (``source``) and the
    key path (``prefix``, "" at the top, "text_config." inside a section)."""

    def __init__(self, data: Any, source: str, prefix: str) -> None:
        if not isinstance(data, dict):
            raise ModelError(f"{source}: {prefix.rstrip('.') or 'config'} must be a JSON object")
        self.data, self.source, self.prefix = data, source, prefix

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        """``key`` as ``kind``; a missing key (or a null one, where there is a default) takes
        ``default``, and is an error without one."""
        value = self.data.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise ModelError(f"{self.source}: missing required key {self.prefix}{key}")
            return default
        # JSON writers differ on 1 vs 1.0: accept either where the value is the same.
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ModelError(f"{self.source}: {self.prefix}{key} must be {kind.__name__}, found {value!r}")
        return value

    def positive(self, key: str, default: Any = _MISSING) -> int:
        value = self.get(key, int, default)
        if value < 1:
            raise ModelError(f"{self.source}: {self.prefix}{key} must be >= 1, found {value}")
        return value

    def ints(self, key: str, default: Any = _MISSING) -> tuple[int, ...]:
        values = self.get(key, list, default)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ModelError(f"{self.source}: {self.prefix}{key} must be a list of integers >= 0, found {values!r}")
        return tuple(values)

    def section(self, key: str) -> JsonSection:
        return JsonSection(self.get(key, dict), self.source, f"{self.prefix}{key}.")

    def check(self, ok: bool, message: str) -> None:
        """A ModelError naming the file and this section unless ``ok``."""
        if not ok:
            where = self.prefix.rstrip(".")
            raise ModelError(f"{self.source}: {where + ': ' if where else ''}{message}")


class CheckpointConfig(abc.ABC):
    """A checkpoint's config, read from its folder's config.json (``from_dir``) or from a dict
    (``from_dict``, naming ``source`` in its errors); a subclass reads the file's top section
    (``from_section``)."""

    @classmethod
    def from_dir(cls, model_dir: Path | str):
        path = Path(model_dir) / CONFIG_FILE
        return cls.from_dict(read_json_object(path, "config"), source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = CONFIG_FILE):
        return cls.from_section(JsonSection(data, source, ""))

    @classmethod
    @abc.abstractmethod
    def from_section(cls, s: JsonSection):
        """The config from config.json's top section ``s``."""
