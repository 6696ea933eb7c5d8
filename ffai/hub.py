"""Downloading checkpoints into the Hugging Face hub-cache layout, and verifying them.

``pull`` writes what ``huggingface_hub`` would, so transformers and ``models.resolve`` both
find the files afterwards::

    <HF_HUB_CACHE>/models--<org>--<name>/
        blobs/<sha256>                    the content; named by its sha256 (also for small files)
        blobs/<sha256>.incomplete         a partial download, continued with an HTTP Range request
        snapshots/<commit>/<path>         a relative symlink to ../../blobs/<sha256>
        refs/<revision>                   the commit the server reported for <revision>

The commit comes from the hub's ``X-Repo-Commit`` header (sent on ``/resolve/`` answers and
their redirects). A server that sends none leaves ``refs/`` alone and the snapshot folder is
named by the revision string itself, which ``models.hf_snapshot`` finds the same way.

Every file is checked against the manifest's size and sha256 before it is renamed into
``blobs/``, so the cache never holds a corrupt blob. Only the standard library is used.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.client import HTTPException
from pathlib import Path, PurePosixPath

from ffai import models
from ffai.errors import ModelError
from ffai.models import Manifest, ModelFile

CHUNK = 1 << 20
TIMEOUT_S = 60.0
_TRUE = {"1", "true", "yes", "on"}
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

Progress = Callable[[str, int, int], None]


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def file_url(manifest: Manifest, file: ModelFile) -> str:
    # Quoted like huggingface_hub: a revision such as "refs/pr/1" becomes one path segment.
    revision = urllib.parse.quote(manifest.revision, safe="")
    return f"{endpoint()}/{manifest.hf_repo}/resolve/{revision}/{urllib.parse.quote(file.path)}"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pull(manifest: Manifest, *, progress: Progress | None = None) -> Path:
    """Download every file of ``manifest`` that is not already in the cache; return the snapshot.

    Files already in the snapshot (or already in ``blobs/``) with the right size and sha256 are
    not fetched again, so a complete model pulls without any request, even offline.
    """
    _check_manifest(manifest)
    report = progress or (lambda path, done, total: None)
    repo_dir = _repo_dir(manifest)
    current = models.hf_snapshot(manifest.hf_repo, manifest.revision)
    todo = [f for f in manifest.files if not _is_good(current / f.path, f)]
    for f in manifest.files:
        if f not in todo:
            report(f.path, f.size, f.size)
    if not todo:
        return current
    blobs = repo_dir / "blobs"
    for f in todo:
        blob = blobs / f.sha256
        if _is_good(blob, f):
            report(f.path, f.size, f.size)
            continue
        if offline():
            raise ModelError(f"offline mode (HF_HUB_OFFLINE=1): cannot download {manifest.name}")
        commit = _download(file_url(manifest, f), f, blob, report)
        if commit and commit != manifest.revision:
            # Written at once, so a pull cut short later still names the same snapshot folder.
            _write_ref(repo_dir, manifest.revision, commit)
    snapshot = models.hf_snapshot(manifest.hf_repo, manifest.revision)
    for f in todo:
        _link(snapshot / f.path, blobs / f.sha256)
    return snapshot


def verify(manifest: Manifest, folder: Path | None = None) -> list[tuple[str, str]]:
    """Re-hash each file of ``manifest`` in ``folder`` (default: where the model is found).

    Each status is "ok", "missing", "size mismatch", "sha256 mismatch" or "unreadable"; a bad
    file never raises. A model that is nowhere on this machine raises ``ModelError``.
    """
    root = folder if folder is not None else models.locate(manifest)
    return [(f.path, _status(root / f.path, f)) for f in manifest.files]


def _check_manifest(manifest: Manifest) -> None:
    # File paths and hashes become paths on disk: refuse anything that could leave the cache.
    if "/" not in manifest.hf_repo or ".." in manifest.hf_repo.split("/"):
        raise ModelError(f"manifest {manifest.name}: hf_repo {manifest.hf_repo!r} is not of the form org/name")
    if not manifest.revision or manifest.revision.startswith("/") or ".." in manifest.revision.split("/"):
        raise ModelError(f"manifest {manifest.name}: unsafe revision {manifest.revision!r}")
    for f in manifest.files:
        parts = PurePosixPath(f.path).parts
        if not parts or f.path.startswith("/") or ".." in parts or "\\" in f.path:
            raise ModelError(f"manifest {manifest.name}: unsafe file path {f.path!r}")
        if not _SHA256.fullmatch(f.sha256):
            raise ModelError(f"manifest {manifest.name}: {f.path}: sha256 {f.sha256!r} is not 64 lowercase hex digits")


def _repo_dir(manifest: Manifest) -> Path:
    return models.hf_hub_cache() / ("models--" + manifest.hf_repo.replace("/", "--"))


def _status(path: Path, file: ModelFile) -> str:
    try:
        if not path.is_file():
            return "missing"
        if path.stat().st_size != file.size:
            return "size mismatch"
        return "ok" if sha256_file(path) == file.sha256 else "sha256 mismatch"
    except OSError:
        return "unreadable"


def _is_good(path: Path, file: ModelFile) -> bool:
    return _status(path, file) == "ok"


def _download(url: str, file: ModelFile, blob: Path, report: Progress) -> str | None:
    """Fetch ``url`` into ``blob`` through ``blob.incomplete``; return the reported commit."""
    blob.parent.mkdir(parents=True, exist_ok=True)
    part = blob.with_name(blob.name + ".incomplete")
    offset = part.stat().st_size if part.is_file() else 0
    if offset and offset == file.size and sha256_file(part) == file.sha256:
        os.replace(part, blob)  # a finished download whose rename was interrupted
        report(file.path, file.size, file.size)
        return None
    if offset >= file.size:
        part.unlink(missing_ok=True)
        offset = 0
    response, commit = _open(url, offset, part)
    with response:
        start = _body_start(response, url, offset, file, part)
        digest = _hash_prefix(part, start)
        with open(part, "r+b" if start else "wb") as out:
            out.truncate(start)
            out.seek(start)
            done = _copy(response, out, digest, start, file, url, part, report)
            out.flush()
            os.fsync(out.fileno())
    if done < file.size:
        raise ModelError(f"{url}: connection closed after {done} of {file.size} bytes; run the pull again to resume")
    found = digest.hexdigest()
    if found != file.sha256:
        part.unlink()
        raise ModelError(
            f"{file.path}: sha256 mismatch (expected {file.sha256}, found {found}); the download was deleted"
        )
    os.replace(part, blob)
    return commit


def _open(url: str, offset: int, part: Path):
    """GET ``url`` (from byte ``offset`` when resuming); return (response, commit or None)."""
    request = urllib.request.Request(url, headers={"User-Agent": "ffai"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    token = os.environ.get("HF_TOKEN")
    if token:
        # Unredirected: _Redirects puts it back only for a redirect to the same host.
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    redirects = _Redirects()
    try:
        response = urllib.request.build_opener(redirects).open(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416:
            # Our partial is as long as the remote file or longer: the remote is not what we expect.
            part.unlink(missing_ok=True)
        hint = " (set HF_TOKEN for a gated or private repository)" if e.code in (401, 403) else ""
        raise ModelError(f"{url}: HTTP {e.code} {e.reason}{hint}") from e
    except (urllib.error.URLError, OSError, HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise ModelError(f"{url}: download failed ({reason})") from e
    commit = _commit(response.headers.get("X-Repo-Commit")) or redirects.commit
    return response, commit


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects, remembering the hub's commit header and keeping the token on-host.

    The hub redirects large files to a CDN with a signed URL; the token must not go there.
    """

    def __init__(self) -> None:
        self.commit: str | None = None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.commit = self.commit or _commit(headers.get("X-Repo-Commit"))
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        token = req.unredirected_hdrs.get("Authorization")
        if (
            new is not None
            and token
            and urllib.parse.urlsplit(newurl).netloc == urllib.parse.urlsplit(req.full_url).netloc
        ):
            new.add_unredirected_header("Authorization", token)
        return new


def _commit(value: str | None) -> str | None:
    return value if value and _COMMIT.fullmatch(value) else None


def _body_start(response, url: str, offset: int, file: ModelFile, part: Path) -> int:
    """Where in the file the response body begins: ``offset`` for a 206, 0 for a 200."""
    if response.status == 206:
        got = response.headers.get("Content-Range", "")
        match = _CONTENT_RANGE.fullmatch(got.strip())
        if match is None or int(match[1]) != offset:
            part.unlink(missing_ok=True)
            raise ModelError(f"{url}: asked for bytes {offset}- but got Content-Range {got!r}; run the pull again")
        total = None if match[3] == "*" else int(match[3])
        start = offset
    else:
        # A 200 to a Range request means the server ignored it: start over from byte 0.
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        start = 0
    if total is not None and total != file.size:
        part.unlink(missing_ok=True)
        raise ModelError(f"{file.path}: size mismatch (expected {file.size} bytes, the server has {total}) at {url}")
    return start


def _hash_prefix(part: Path, length: int):
    """A sha256 already fed the first ``length`` bytes of the partial download."""
    digest = hashlib.sha256()
    if length:
        with open(part, "rb") as f:
            remaining = length
            while remaining and (chunk := f.read(min(CHUNK, remaining))):
                digest.update(chunk)
                remaining -= len(chunk)
    return digest


def _copy(response, out, digest, done: int, file: ModelFile, url: str, part: Path, report: Progress) -> int:
    """Stream the body into ``out`` in 1 MiB chunks; return the bytes now on disk."""
    report(file.path, done, file.size)
    while True:
        try:
            chunk = response.read(CHUNK)
        except (OSError, HTTPException) as e:
            where = f"after {done} of {file.size} bytes"
            raise ModelError(f"{url}: download interrupted {where} ({e}); run the pull again to resume") from e
        if not chunk:
            return done
        if done + len(chunk) > file.size:
            out.close()
            part.unlink()
            raise ModelError(f"{file.path}: size mismatch (expected {file.size} bytes, the server sent more) at {url}")
        out.write(chunk)
        digest.update(chunk)
        done += len(chunk)
        report(file.path, done, file.size)


def _write_ref(repo_dir: Path, revision: str, commit: str) -> None:
    ref = repo_dir / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def _link(link: Path, blob: Path) -> None:
    """Point ``link`` at ``blob`` with a relative symlink, replacing whatever was there."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(os.path.relpath(blob, link.parent), tmp)
        os.replace(tmp, link)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"{link}: cannot link to {blob} ({e})") from e
