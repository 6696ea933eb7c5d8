"""Model manifests and where checkpoints are found on disk.

Lookup order for ``--model SPEC`` (DESIGN §5): a folder path holding ``config.json`` →
``$FFAI_HOME/models/<name>`` → the models bundled with ffai (``models/``: the demo model) →
the Hugging Face hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``; snapshot layout, so checkpoints that transformers downloaded
are reused) → a clear error naming ``ffai models pull``. A name with no manifest is looked
for in ``$FFAI_HOME/models/<name>`` only. Without ``--model``, ``default_model`` chooses.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ffai.errors import ModelError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{8,63}")
_FILE_KEYS = {"path", "size", "sha256", "sha256_prefix"}
_KEYS = {"name", "engine", "hf_repo", "revision", "license", "description", "fallbacks", "files"}


@dataclass(frozen=True)
class ModelFile:
    """One file of a checkpoint and what the manifest knows of it.

    ``sha256`` pins the content; a file known only by a ``sha256_prefix``, or by nothing, is
    checked against the hash the hub announces for it (``ffai.models.hub``), and the prefix as well.
    ``size`` is None where the manifest does not know it (the hub's answer then says it).
    """

    path: str
    size: int | None
    sha256: str | None
    sha256_prefix: str | None = None

    @property
    def pin(self) -> str:
        """How the manifest pins the content: "sha256", "sha256-prefix" or "none"."""
        if self.sha256:
            return "sha256"
        return "sha256-prefix" if self.sha256_prefix else "none"

    @classmethod
    def from_table(cls, table: dict) -> "ModelFile":
        unknown = set(table) - _FILE_KEYS
        if unknown:
            raise ValueError(f"unknown key {sorted(unknown)[0]!r} in a [[files]] entry")
        path = str(table["path"])
        size = table.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise ValueError(f"{path}: size {size!r} is not a byte count")
        sha256, prefix = table.get("sha256"), table.get("sha256_prefix")
        if sha256 is not None and not _HEX64.fullmatch(str(sha256)):
            raise ValueError(f"{path}: sha256 {sha256!r} is not 64 lowercase hex digits")
        if prefix is not None and (sha256 is not None or not _HEX.fullmatch(str(prefix))):
            raise ValueError(f"{path}: sha256_prefix {prefix!r} is not 8 to 63 lowercase hex digits beside no sha256")
        return cls(path, size, sha256 and str(sha256), prefix and str(prefix))


@dataclass(frozen=True)
class Manifest:
    name: str
    engine: str
    hf_repo: str
    revision: str
    license: str
    description: str
    files: tuple[ModelFile, ...]
    # Models that stand in, in this order and with a notice, when this one is the engine's
    # default and is not on the machine (before the bundled demo model).
    fallbacks: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """The bytes the manifest knows of (every file's, when ``size_known``)."""
        return sum(f.size or 0 for f in self.files)

    @property
    def size_known(self) -> bool:
        return all(f.size is not None for f in self.files)

    @property
    def pinned(self) -> tuple[ModelFile, ...]:
        return tuple(f for f in self.files if f.sha256)

    @classmethod
    def from_toml(cls, path: Path) -> "Manifest":
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            unknown = set(data) - _KEYS
            if unknown:
                raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
            return cls(
                name=str(data["name"]),
                engine=str(data["engine"]),
                hf_repo=str(data["hf_repo"]),
                revision=str(data["revision"]),
                license=str(data["license"]),
                description=str(data["description"]),
                files=tuple(ModelFile.from_table(f) for f in data["files"]),
                fallbacks=tuple(str(n) for n in data.get("fallbacks", ())),
            )
        except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
            raise ModelError(f"{path}: not a valid model manifest ({e})") from e


def manifest_paths() -> list[Path]:
    return sorted(p for p in bundled_dir().iterdir() if p.name.endswith(".toml"))


def manifests() -> list[Manifest]:
    return [Manifest.from_toml(p) for p in manifest_paths()]


def find_manifest(name: str) -> Manifest | None:
    return next((m for m in manifests() if m.name == name), None)


def ffai_home() -> Path:
    return Path(os.environ.get("FFAI_HOME") or Path.home() / ".cache" / "ffai").expanduser()


def hf_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hf_snapshot(repo: str, revision: str) -> Path:
    """The snapshot folder of ``repo`` at ``revision`` in the hub cache (it may not exist).

    A branch name is followed through ``refs/<branch>`` to its commit, as huggingface_hub does.
    """
    repo_dir = hf_hub_cache() / ("models--" + repo.replace("/", "--"))
    ref = repo_dir / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    return repo_dir / "snapshots" / commit


def bundled_dir() -> Path:
    """Where the manifests (and the bundled demo checkpoint) are installed."""
    return Path(str(resources.files("ffai.models") / "bundled"))


def candidates(manifest: Manifest) -> list[Path]:
    """Where ``manifest``'s model may be, in lookup order."""
    found = [ffai_home() / "models" / manifest.name, bundled_dir() / manifest.name]
    if manifest.hf_repo:
        found.append(hf_snapshot(manifest.hf_repo, manifest.revision))
    return found


def locate(manifest: Manifest) -> Path:
    """The folder holding ``manifest``'s model, or a ModelError naming ``ffai models pull``."""
    places = candidates(manifest)
    for folder in places:
        if (folder / "config.json").is_file():
            return folder
    looked = ", ".join(str(c) for c in places)
    raise ModelError(
        f"model {manifest.name!r} is not on this machine (looked in {looked}); "
        f"run `ffai models pull {manifest.name}` or pass --model PATH"
    )


def looks_like_path(spec: str) -> bool:
    return os.sep in spec or spec.startswith((".", "~")) or Path(spec).exists()


def _checkpoint_dir(path: Path) -> Path:
    if not path.is_dir():
        raise ModelError(f"{path}: not a folder (a model is a folder holding config.json)")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no config.json in this folder")
    return path


def resolve(spec: str) -> Path:
    """The checkpoint folder for a model name or path, following the lookup order above."""
    if looks_like_path(spec):
        return _checkpoint_dir(Path(spec).expanduser())
    manifest = find_manifest(spec)
    if manifest is not None:
        return locate(manifest)
    own = ffai_home() / "models" / spec
    if (own / "config.json").is_file():
        return own
    known = ", ".join(m.name for m in manifests()) or "none"
    raise ModelError(f"no model named {spec!r} (known: {known}); pass --model PATH to a checkpoint folder")


def find(manifest: Manifest) -> Path | None:
    """The folder holding ``manifest``'s model, or None when it is not on this machine."""
    return next((c for c in candidates(manifest) if (c / "config.json").is_file()), None)


def default_model(engine: str, engine_default: str) -> tuple[str, str | None]:
    """The model to use when ``--model`` is not given, and a notice to show when it is a stand-in.

    ``$FFAI_MODEL`` → the engine's default model if it is on this machine → the first of the
    default manifest's ``fallbacks`` on this machine → a model bundled with ffai for this engine
    (the small demo). A stand-in comes with a one-line notice naming it and how to get the default.
    """
    if os.environ.get("FFAI_MODEL"):
        return os.environ["FFAI_MODEL"], None
    default = find_manifest(engine_default)
    if default is None or find(default) is not None:
        return engine_default, None
    get = f"`ffai models pull {engine_default}`"
    for name in default.fallbacks:
        stand_in = find_manifest(name)
        if stand_in is not None and find(stand_in) is not None:
            return name, f"{engine_default} is not on this machine; using {name} (get {engine_default} with {get})"
    for m in manifests():
        if m.engine == engine and not m.hf_repo and (bundled_dir() / m.name / "config.json").is_file():
            demo = f"using the small bundled demo model {m.name} (get the real one with {get})"
            return m.name, f"{engine_default} is not on this machine; {demo}"
    return engine_default, None
