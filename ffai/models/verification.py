"""Whether a checkpoint's files are those its manifest names, and the record of what was checked.

A file the manifest pins by sha256 is checked against the pin. A file it knows only by a sha256
prefix, or not at all, is checked against the hash the hub announced for it (and the prefix):
the hash ``ffai models pull`` recorded when it downloaded and checked the file, else the blob's
name in a hub cache (huggingface_hub names a blob by the hub's ETag: an LFS file's sha256, another
file's git blob sha1). What was checked is recorded in ``RECORD`` beside the checkpoint's files, for
models with a file the manifest does not pin, so a later ``verify`` and ``ffai models list`` know
which files were verified only against the hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ffai.errors import ModelError
from ffai.models import Manifest, ModelFile

CHUNK = 1 << 20
RECORD = ".ffai-verified.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class FileCheck:
    path: str
    # "ok", "missing", "unreadable", "size mismatch", "sha256 mismatch" (the manifest's sha256 or
    # prefix), "hub hash mismatch" (the hash the hub announced), "no hash known"
    status: str
    against: str | None  # "manifest" or "hub" when ok


class Digests:
    """sha256 and git's blob sha1 of one file, fed in chunks (git's needs the size first)."""

    def __init__(self, size: int) -> None:
        self.sha256 = hashlib.sha256()
        self.git_sha1 = hashlib.sha1(f"blob {size}\0".encode())

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        self.git_sha1.update(chunk)

    def matches(self, hub_hash: str) -> bool:
        """Whether the content is what the hub's hash names (a sha256, or a git blob sha1)."""
        found = self.sha256 if len(hub_hash) == 64 else self.git_sha1
        return found.hexdigest() == hub_hash


def hub_hash(etag: str | None) -> str | None:
    """The content hash an ETag names, normalised as huggingface_hub does (``W/"…"`` → ``…``);
    None for anything that is neither a sha256 nor a git blob sha1 (a CDN's own tag)."""
    if not etag:
        return None
    value = etag.strip()
    value = value[2:] if value.startswith("W/") else value
    value = value.strip('"').lower()
    return value if _SHA256.fullmatch(value) or _GIT_SHA1.fullmatch(value) else None


def digests(path: Path) -> Digests:
    found = Digests(path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            found.update(chunk)
    return found


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def needs_record(manifest: Manifest) -> bool:
    """Whether the manifest leaves a file's content to the hub's word (the manifest vouches for the rest)."""
    return any(f.pin != "sha256" for f in manifest.files)


def read_record(folder: Path, manifest: Manifest) -> dict[str, dict]:
    """The files the record beside ``folder``'s checkpoint vouches for; {} without a readable
    record of this model at this revision (a record of another revision vouches for nothing)."""
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        if (data["model"], data["hf_repo"], data["revision"]) != (manifest.name, manifest.hf_repo, manifest.revision):
            return {}
        files = data["files"]
        return {str(k): v for k, v in files.items() if isinstance(v, dict) and isinstance(v.get("sha256"), str)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_record(folder: Path, manifest: Manifest, files: dict[str, dict]) -> None:
    """Write the record atomically (a temporary file renamed into place)."""
    record = {"model": manifest.name, "hf_repo": manifest.hf_repo, "revision": manifest.revision, "files": files}
    target = folder / RECORD
    tmp = folder / f".{RECORD}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"{target}: cannot write the verification record ({e.strerror or e})") from e


def entry(size: int, sha256: str, against: str, hub: str | None = None) -> dict:
    """One file's line in the record: what was found, against what it was checked, and when."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"size": size, "sha256": sha256, "against": against, "hub": hub, "checked": when}


def _blob_name(path: Path) -> str | None:
    # A hub-cache snapshot links each file to blobs/<the hub's ETag>, which huggingface_hub checked.
    if not path.is_symlink():
        return None
    target = Path(os.path.realpath(path))
    return hub_hash(target.name) if target.parent.name == "blobs" else None


def check(path: Path, file: ModelFile, recorded: dict | None) -> tuple[FileCheck, dict | None]:
    """Re-hash one file; return its check and, when ok, its record entry."""
    try:
        if not path.is_file():
            return FileCheck(file.path, "missing", None), None
        size = path.stat().st_size
        if file.size is not None and size != file.size:
            return FileCheck(file.path, "size mismatch", None), None
        found = digests(path)
    except OSError:
        return FileCheck(file.path, "unreadable", None), None
    sha256 = found.sha256.hexdigest()
    hub = recorded.get("hub") if recorded else None
    if file.sha256:
        if sha256 != file.sha256:
            return FileCheck(file.path, "sha256 mismatch", None), None
        return FileCheck(file.path, "ok", "manifest"), entry(size, sha256, "manifest", hub)
    if file.sha256_prefix and not sha256.startswith(file.sha256_prefix):
        return FileCheck(file.path, "sha256 mismatch", None), None
    reference = recorded["sha256"] if recorded else _blob_name(path)
    if reference is None:
        return FileCheck(file.path, "no hash known", None), None
    if recorded and recorded.get("size") != size:
        return FileCheck(file.path, "size mismatch", None), None
    if not found.matches(reference):
        return FileCheck(file.path, "hub hash mismatch", None), None
    return FileCheck(file.path, "ok", "hub"), entry(size, sha256, "hub", hub or reference)


def verify(manifest: Manifest, folder: Path) -> list[FileCheck]:
    """Re-hash each file of ``manifest`` in ``folder`` and, where the manifest does not pin
    every file, rewrite the record (a file that fails keeps the hub's hash it was recorded with)."""
    recorded = read_record(folder, manifest)
    results, files = [], dict(recorded)
    for f in manifest.files:
        result, line = check(folder / f.path, f, recorded.get(f.path))
        results.append(result)
        if line is not None:
            files[f.path] = line
    if needs_record(manifest):
        write_record(folder, manifest, {f.path: files[f.path] for f in manifest.files if f.path in files})
    return results


def verified_against(manifest: Manifest, folder: Path) -> dict[str, str | None]:
    """Per file, without hashing, what the record says it was last checked against ("manifest"
    or "hub"); None where the record has no line for it (or there is no record)."""
    recorded = read_record(folder, manifest)
    return {f.path: recorded.get(f.path, {}).get("against") for f in manifest.files}
