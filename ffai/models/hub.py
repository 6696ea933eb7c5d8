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

Every file is checked before it is renamed into ``blobs/``, so the cache never holds a corrupt
blob: against the manifest's sha256 where it pins one, and always against the hash the hub
announces for it, read where huggingface_hub reads it (``X-Linked-Etag``, else ``ETag``, on the
hub's own answer before any redirect to another host: an LFS file's sha256, another file's git
blob sha1). A file the manifest does not pin is asked about first (a HEAD request, as
huggingface_hub does) and must have an announced hash; a sha256 prefix in the manifest must
match it too. What was checked is recorded beside the snapshot (``ffai.models.verification``). Only
the standard library is used.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.client import HTTPException
from pathlib import Path, PurePosixPath

from ffai import models
from ffai.errors import ModelError
from ffai.models import Manifest, ModelFile, verification
from ffai.models.verification import Digests, sha256_file

CHUNK = 1 << 20
TIMEOUT_S = 60.0
_TRUE = {"1", "true", "yes", "on"}
_COMMIT = re.compile(r"[0-9a-f]{40}")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

Progress = Callable[[str, int, int], None]

__all__ = ["endpoint", "file_url", "offline", "pull", "sha256_file", "verify"]


@dataclass(frozen=True)
class _Expected:
    """What one download must be: the manifest's knowledge, completed by the hub's announcement."""

    path: str
    size: int
    sha256: str | None  # the manifest's pin, else the sha256 the hub announced for an LFS file
    git_sha1: str | None = None  # the hub's ETag of a non-LFS file
    prefix: str | None = None
    hub: str | None = None  # the hash the hub announced, as it announced it

    @property
    def key(self) -> str:
        """The name the download has in ``blobs/`` while it is incomplete."""
        return self.sha256 or self.git_sha1 or ""


@dataclass(frozen=True)
class _Answer:
    """What the hub's own answer to a /resolve/ request said about the file."""

    hub_hash: str | None  # a sha256 or a git blob sha1 (verification.hub_hash), else None
    size: int | None
    commit: str | None


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def file_url(manifest: Manifest, file: ModelFile) -> str:
    # Quoted like huggingface_hub: a revision such as "refs/pr/1" becomes one path segment.
    revision = urllib.parse.quote(manifest.revision, safe="")
    return f"{endpoint()}/{manifest.hf_repo}/resolve/{revision}/{urllib.parse.quote(file.path)}"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def pull(manifest: Manifest, *, progress: Progress | None = None) -> Path:
    """Download every file of ``manifest`` that is not already in the cache; return the snapshot.

    Files already in the snapshot (or already in ``blobs/``) and verified (against the manifest,
    or against the hub's hash the record holds) are not fetched again, so a complete model pulls
    without any request, even offline.
    """
    _check_manifest(manifest)
    report = progress or (lambda path, done, total: None)
    repo_dir = _repo_dir(manifest)
    current = models.hf_snapshot(manifest.hf_repo, manifest.revision)
    recorded = verification.read_record(current, manifest)
    lines: dict[str, dict] = {}
    todo = []
    for f in manifest.files:
        result, line = verification.check(current / f.path, f, recorded.get(f.path))
        if result.status == "ok":
            lines[f.path] = line
            report(f.path, line["size"], line["size"])
        else:
            todo.append(f)
    if not todo:
        return current
    blobs = repo_dir / "blobs"
    fetched: dict[str, str] = {}  # path -> its blob's name (the content's sha256)
    for f in todo:
        if f.sha256 and _is_good(blobs / f.sha256, f.size, f.sha256):
            fetched[f.path] = f.sha256
            lines[f.path] = verification.entry(f.size, f.sha256, "manifest")
            report(f.path, f.size, f.size)
            continue
        if offline():
            raise ModelError(f"offline mode (HF_HUB_OFFLINE=1): cannot download {manifest.name}")
        url = file_url(manifest, f)
        expected = _expected(url, f)
        if expected.sha256 and _is_good(blobs / expected.sha256, expected.size, expected.sha256):
            report(f.path, expected.size, expected.size)
            sha256, commit, announced = expected.sha256, None, expected.hub
        else:
            sha256, commit, announced = _download(url, expected, blobs, report)
        if commit and commit != manifest.revision:
            # Written at once, so a pull cut short later still names the same snapshot folder.
            _write_ref(repo_dir, manifest.revision, commit)
        fetched[f.path] = sha256
        against = "manifest" if f.sha256 else "hub"
        lines[f.path] = verification.entry(expected.size, sha256, against, announced)
    snapshot = models.hf_snapshot(manifest.hf_repo, manifest.revision)
    for path, sha256 in fetched.items():
        _link(snapshot / path, blobs / sha256)
    if verification.needs_record(manifest):
        verification.write_record(snapshot, manifest, {f.path: lines[f.path] for f in manifest.files})
    return snapshot


def verify(manifest: Manifest, folder: Path | None = None) -> list[verification.FileCheck]:
    """Re-hash each file of ``manifest`` in ``folder`` (default: where the model is found) and
    record the result (``ffai.models.verification.verify``). A bad file never raises; a model that is
    nowhere on this machine raises ``ModelError``."""
    root = folder if folder is not None else models.locate(manifest)
    return verification.verify(manifest, root)


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
        if f.sha256 is not None and verification.hub_hash(f.sha256) != f.sha256:
            raise ModelError(f"manifest {manifest.name}: {f.path}: sha256 {f.sha256!r} is not 64 lowercase hex digits")


def _repo_dir(manifest: Manifest) -> Path:
    return models.hf_hub_cache() / ("models--" + manifest.hf_repo.replace("/", "--"))


def _is_good(path: Path, size: int | None, sha256: str) -> bool:
    try:
        return path.is_file() and (size is None or path.stat().st_size == size) and sha256_file(path) == sha256
    except OSError:
        return False


def _expected(url: str, file: ModelFile) -> _Expected:
    """What ``file``'s download must be. A pinned file needs no question; for another the hub's
    answer to a HEAD request must announce a hash (and its size), matching any prefix."""
    if file.sha256 and file.size is not None:
        return _Expected(file.path, file.size, file.sha256)
    answer = _ask(url)
    announced = answer.hub_hash
    if announced is None:
        raise ModelError(
            f"{file.path}: the manifest pins no sha256 and the hub announced none for it at {url}; "
            "refusing a file nothing can verify"
        )
    size = file.size if file.size is not None else answer.size
    if size is None:
        raise ModelError(f"{file.path}: the hub announced no size for it at {url}, and the manifest has none")
    if answer.size is not None and answer.size != size:
        raise ModelError(
            f"{file.path}: size mismatch (expected {size} bytes, the hub announces {answer.size}) at {url}"
        )
    lfs = len(announced) == 64
    if file.sha256_prefix and not (lfs and announced.startswith(file.sha256_prefix)):
        raise ModelError(
            f"{file.path}: the hub announces {announced} at {url}, not a sha256 beginning with the manifest's "
            f"{file.sha256_prefix}; nothing was downloaded"
        )
    return _Expected(
        file.path,
        size,
        file.sha256 or (announced if lfs else None),
        None if lfs else announced,
        file.sha256_prefix,
        announced,
    )


def _with_announcement(expected: _Expected, answer: _Answer, url: str) -> _Expected:
    """``expected`` checked against the GET's announcement: a hub that names other content than
    the manifest pins (or than its own HEAD said) is refused before any byte is written."""
    announced = answer.hub_hash
    if announced is None:
        return expected
    if len(announced) == 64:
        if expected.sha256 and announced != expected.sha256:
            raise ModelError(
                f"{expected.path}: the hub announces sha256 {announced} at {url}, but "
                f"{'the manifest pins' if expected.hub is None else 'it announced'} {expected.sha256}; "
                "nothing was written"
            )
        return replace(expected, sha256=announced, hub=expected.hub or announced)
    if expected.git_sha1 and announced != expected.git_sha1:
        raise ModelError(
            f"{expected.path}: the hub announces git blob {announced} at {url}, but it announced "
            f"{expected.git_sha1}; nothing was written"
        )
    return replace(expected, git_sha1=announced, hub=expected.hub or announced)


def _download(url: str, expected: _Expected, blobs: Path, report: Progress) -> tuple[str, str | None, str | None]:
    """Fetch ``url`` into ``blobs/<sha256>`` through ``blobs/<key>.incomplete``; return the
    content's sha256, the commit the hub reported and the hash it announced."""
    blobs.mkdir(parents=True, exist_ok=True)
    part = blobs / (expected.key + ".incomplete")
    offset = part.stat().st_size if part.is_file() else 0
    if offset and offset == expected.size and expected.sha256 and sha256_file(part) == expected.sha256:
        os.replace(part, blobs / expected.sha256)  # a finished download whose rename was interrupted
        report(expected.path, expected.size, expected.size)
        return expected.sha256, None, expected.hub
    if offset >= expected.size:
        part.unlink(missing_ok=True)
        offset = 0
    response, answer = _open(url, offset, part)
    with response:
        expected = _with_announcement(expected, answer, url)
        start = _body_start(response, url, offset, expected, part)
        digest = _hash_prefix(part, start, expected.size)
        with open(part, "r+b" if start else "wb") as out:
            out.truncate(start)
            out.seek(start)
            done = _copy(response, out, digest, start, expected, url, part, report)
            out.flush()
            os.fsync(out.fileno())
    if done < expected.size:
        raise ModelError(
            f"{url}: connection closed after {done} of {expected.size} bytes; run the pull again to resume"
        )
    found = digest.sha256.hexdigest()
    wrong = None
    if expected.sha256 and found != expected.sha256:
        wrong = f"sha256 mismatch (expected {expected.sha256}, found {found})"
    elif expected.git_sha1 and not digest.matches(expected.git_sha1):
        wrong = f"git blob sha1 mismatch (the hub announced {expected.git_sha1}, found {digest.git_sha1.hexdigest()})"
    elif expected.prefix and not found.startswith(expected.prefix):
        wrong = f"sha256 mismatch (expected one beginning {expected.prefix}, found {found})"
    if wrong:
        part.unlink()
        raise ModelError(f"{expected.path}: {wrong}; the download was deleted")
    os.replace(part, blobs / found)
    return found, answer.commit, expected.hub


def _request(url: str, method: str, offset: int = 0) -> urllib.request.Request:
    request = urllib.request.Request(url, headers={"User-Agent": "ffai"}, method=method)
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    token = os.environ.get("HF_TOKEN")
    if token:
        # Unredirected: _Redirects puts it back only for a redirect to the same host.
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    return request


def _ask(url: str) -> _Answer:
    """HEAD ``url`` as huggingface_hub does: relative redirects followed, the first answer that is
    not one read (for an LFS file, the redirect to the CDN, which is not followed)."""
    redirects = _Redirects(follow_absolute=False)
    try:
        response = urllib.request.build_opener(redirects).open(_request(url, "HEAD"), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        e.close()
        if 300 <= e.code < 400 and redirects.answer is not None:
            return redirects.answer
        raise _http_error(url, e) from e
    except (urllib.error.URLError, OSError, HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise ModelError(f"{url}: asking the hub about the file failed ({reason})") from e
    with response:
        return redirects.answer or _answer(response.headers, redirect=False)


def _open(url: str, offset: int, part: Path):
    """GET ``url`` (from byte ``offset`` when resuming); return (response, the hub's answer)."""
    redirects = _Redirects(follow_absolute=True)
    try:
        response = urllib.request.build_opener(redirects).open(_request(url, "GET", offset), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416:
            # Our partial is as long as the remote file or longer: the remote is not what we expect.
            part.unlink(missing_ok=True)
        raise _http_error(url, e) from e
    except (urllib.error.URLError, OSError, HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise ModelError(f"{url}: download failed ({reason})") from e
    answer = redirects.answer or _answer(response.headers, redirect=False)
    commit = answer.commit or redirects.commit
    return response, _Answer(answer.hub_hash, answer.size, commit)


def _http_error(url: str, e: urllib.error.HTTPError) -> ModelError:
    hint = " (set HF_TOKEN for a gated or private repository)" if e.code in (401, 403) else ""
    return ModelError(f"{url}: HTTP {e.code} {e.reason}{hint}")


def _answer(headers, *, redirect: bool) -> _Answer:
    # As huggingface_hub's get_hf_file_metadata: the linked (LFS) etag and size win; a
    # redirect's Content-Length is its own body's.
    size = headers.get("X-Linked-Size") or (None if redirect else headers.get("Content-Length"))
    return _Answer(
        verification.hub_hash(headers.get("X-Linked-Etag") or headers.get("ETag")),
        int(size) if size and size.isdigit() else None,
        _commit(headers.get("X-Repo-Commit")),
    )


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects, remembering the hub's answer and keeping the token on-host.

    The hub's answer is the first response that is not a relative redirect (huggingface_hub
    follows only those for metadata): for an LFS file, the redirect to the CDN, whose own
    answer says nothing about the hub's file. The CDN's URL is signed; the token must not go there.
    """

    def __init__(self, *, follow_absolute: bool) -> None:
        self.follow_absolute = follow_absolute
        self.commit: str | None = None
        self.answer: _Answer | None = None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.commit = self.commit or _commit(headers.get("X-Repo-Commit"))
        relative = not urllib.parse.urlsplit(headers.get("Location", "")).netloc
        if not relative and self.answer is None:
            self.answer = _answer(headers, redirect=True)
        if not relative and not self.follow_absolute:
            return None
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and req.get_method() == "HEAD":
            new.method = "HEAD"  # urllib's handler makes every redirect a GET (3.11), which would fetch the body
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


def _body_start(response, url: str, offset: int, expected: _Expected, part: Path) -> int:
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
    if total is not None and total != expected.size:
        part.unlink(missing_ok=True)
        raise ModelError(
            f"{expected.path}: size mismatch (expected {expected.size} bytes, the server has {total}) at {url}"
        )
    return start


def _hash_prefix(part: Path, length: int, size: int) -> Digests:
    """Digests already fed the first ``length`` bytes of the partial download."""
    digest = Digests(size)
    if length:
        with open(part, "rb") as f:
            remaining = length
            while remaining and (chunk := f.read(min(CHUNK, remaining))):
                digest.update(chunk)
                remaining -= len(chunk)
    return digest


def _copy(response, out, digest, done: int, expected: _Expected, url: str, part: Path, report: Progress) -> int:
    """Stream the body into ``out`` in 1 MiB chunks; return the bytes now on disk."""
    report(expected.path, done, expected.size)
    while True:
        try:
            chunk = response.read(CHUNK)
        except (OSError, HTTPException) as e:
            where = f"after {done} of {expected.size} bytes"
            raise ModelError(f"{url}: download interrupted {where} ({e}); run the pull again to resume") from e
        if not chunk:
            return done
        if done + len(chunk) > expected.size:
            out.close()
            part.unlink()
            raise ModelError(
                f"{expected.path}: size mismatch (expected {expected.size} bytes, the server sent more) at {url}"
            )
        out.write(chunk)
        digest.update(chunk)
        done += len(chunk)
        report(expected.path, done, expected.size)


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
