"""The oracle stands still: the reference extra pins transformers to one exact version, and that
version is the one installed, so CI compares against the release the tests were written for
(moving it: docs/engines.md, "Moving the oracle")."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def pinned(package: str) -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    (spec,) = [s for s in extras["reference"] if re.match(rf"{package}\b", s)]
    match = re.fullmatch(rf"{package}==([\w.]+)", spec.replace(" ", ""))
    assert match, f"the reference extra must pin {package} exactly (==), not {spec!r}"
    return match.group(1)


def test_the_installed_transformers_is_the_pinned_one():
    assert importlib.metadata.version("transformers") == pinned("transformers")
