"""`ffai models pull` / `verify` end to end against a loopback hub (tests/hub_server.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil

import pytest

from ffai import models
from ffai.errors import ModelError
from ffai.models import Manifest, ModelFile, hub, verification
from hub_server import HubServer, git_blob_sha1

REPO = "test-org/tiny-vlm"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONTENT = {
    "config.json": json.dumps({"model_type": "idefics3", "hidden_size": 64}).encode(),
    "model.safetensors": random.Random(0).randbytes(300_000),
    "sub/tokenizer.json": b'{"version": "1.0"}',
}
WEIGHTS = "model.safetensors"


def manifest_for(content: dict[str, bytes], revision: str = "main") -> Manifest:
    files = tuple(ModelFile(path, len(body), hashlib.sha256(body).hexdigest()) for path, body in content.items())
    return Manifest("tiny-vlm", "smolvlm", REPO, revision, "Apache-2.0", "test checkpoint", files)


MANIFEST = manifest_for(CONTENT)


@pytest.fixture
def server(tmp_path, monkeypatch):
    hub_server = HubServer(commit=COMMIT)
    for path, body in CONTENT.items():
        hub_server.add(REPO, "main", path, body)
    hub_server.start()
    for name in ("HF_HOME", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("FFAI_HOME", str(tmp_path / "ffai"))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url + "/")
    yield hub_server
    hub_server.stop()


def repo_dir():
    return models.hf_hub_cache() / "models--test-org--tiny-vlm"


def blob_names() -> list[str]:
    blobs = repo_dir() / "blobs"
    return sorted(os.listdir(blobs)) if blobs.is_dir() else []


def sha(path: str) -> str:
    return hashlib.sha256(CONTENT[path]).hexdigest()


def checks(results) -> list[tuple[str, str]]:
    return [(r.path, r.status) for r in results]


def test_endpoint_and_url(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example/hf/")
    assert hub.endpoint() == "http://mirror.example/hf"
    pr = manifest_for({"a b.json": b"x"}, revision="refs/pr/1")
    assert (
        hub.file_url(pr, pr.files[0]) == "http://mirror.example/hf/test-org/tiny-vlm/resolve/refs%2Fpr%2F1/a%20b.json"
    )
    monkeypatch.delenv("HF_ENDPOINT")
    assert hub.endpoint() == "https://huggingface.co"


def test_fresh_pull_writes_the_hub_cache_layout(server):
    calls = []
    snapshot = hub.pull(MANIFEST, progress=lambda path, done, total: calls.append((path, done, total)))
    assert snapshot == repo_dir() / "snapshots" / COMMIT
    assert (repo_dir() / "refs" / "main").read_text() == COMMIT
    assert models.hf_snapshot(REPO, "main") / "config.json" == snapshot / "config.json"
    for path, body in CONTENT.items():
        link = snapshot / path
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve() == (repo_dir() / "blobs" / sha(path)).resolve()
        assert link.read_bytes() == body
    assert os.readlink(snapshot / "sub/tokenizer.json") == f"../../../blobs/{sha('sub/tokenizer.json')}"
    assert blob_names() == sorted(sha(p) for p in CONTENT)
    assert calls[-1] == ("sub/tokenizer.json", len(CONTENT["sub/tokenizer.json"]), len(CONTENT["sub/tokenizer.json"]))
    assert (WEIGHTS, 300_000, 300_000) in calls

    seen = len(server.requests)
    assert hub.pull(MANIFEST) == snapshot  # complete: nothing is fetched again
    assert len(server.requests) == seen


def test_pull_without_commit_header_names_the_snapshot_by_revision(server):
    server.commit = None
    snapshot = hub.pull(MANIFEST)
    assert snapshot == repo_dir() / "snapshots" / "main"
    assert not (repo_dir() / "refs").exists()
    assert models.hf_snapshot(REPO, "main") == snapshot


def test_pull_through_redirect_keeps_commit_and_token_on_host(server, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    server.redirect = "cross"
    snapshot = hub.pull(MANIFEST)
    assert snapshot.name == COMMIT  # X-Repo-Commit came on the 302 only
    resolve = [s for s in server.requests if not s.path.startswith("/cdn/")]
    cdn = [s for s in server.requests if s.path.startswith("/cdn/")]
    # Only the LFS file goes to the CDN, as on the hub, which serves small files itself.
    assert len(resolve) == len(CONTENT) and [s.path for s in cdn] == [f"/cdn/{REPO}/resolve/main/{WEIGHTS}"]
    assert all(s.headers.get("Authorization") == "Bearer hf_secret" for s in resolve)
    assert not any("Authorization" in s.headers for s in cdn)


def test_interrupted_pull_resumes_with_range(server):
    server.cut_after[WEIGHTS] = 120_000
    with pytest.raises(ModelError, match="run the pull again to resume"):
        hub.pull(MANIFEST)
    part = repo_dir() / "blobs" / (sha(WEIGHTS) + ".incomplete")
    assert part.stat().st_size == 120_000
    assert not (repo_dir() / "blobs" / sha(WEIGHTS)).exists()

    snapshot = hub.pull(MANIFEST)
    assert server.ranges() == ["bytes=120000-"]
    assert hashlib.sha256((snapshot / WEIGHTS).read_bytes()).hexdigest() == sha(WEIGHTS)
    assert not part.exists()


def test_server_ignoring_range_restarts_from_zero(server):
    server.cut_after[WEIGHTS] = 50_000
    with pytest.raises(ModelError):
        hub.pull(MANIFEST)
    server.ignore_range = True
    snapshot = hub.pull(MANIFEST)
    assert server.ranges() == ["bytes=50000-"]  # asked, answered with 200 and the whole file
    assert (snapshot / WEIGHTS).read_bytes() == CONTENT[WEIGHTS]
    assert blob_names() == sorted(sha(p) for p in CONTENT)


def test_corrupt_download_is_refused_and_removed(server):
    bad = bytearray(CONTENT[WEIGHTS])
    bad[1000] ^= 0xFF
    server.add(REPO, "main", WEIGHTS, bytes(bad))
    server.announce[WEIGHTS] = sha(WEIGHTS)  # the hub names the right file; the bytes are not it
    with pytest.raises(ModelError) as info:
        hub.pull(MANIFEST)
    message = str(info.value)
    assert WEIGHTS in message and "sha256 mismatch" in message
    assert sha(WEIGHTS) in message and hashlib.sha256(bad).hexdigest() in message
    assert not any(name.startswith(sha(WEIGHTS)) for name in blob_names())
    assert not (models.hf_snapshot(REPO, "main") / WEIGHTS).exists()


def test_wrong_size_is_refused(server):
    server.add(REPO, "main", WEIGHTS, CONTENT[WEIGHTS] + b"extra")
    server.announce[WEIGHTS] = sha(WEIGHTS)
    with pytest.raises(ModelError, match="size mismatch"):
        hub.pull(MANIFEST)
    assert not any(name.startswith(sha(WEIGHTS)) for name in blob_names())


@pytest.mark.parametrize("code", [404, 401, 503])
def test_http_error_is_one_line_naming_url_and_status(server, code):
    missing = manifest_for({**CONTENT, "extra.bin": b"not served"})
    if code != 404:
        server.status["extra.bin"] = code
        server.add(REPO, "main", "extra.bin", b"not served")
    with pytest.raises(ModelError) as info:
        hub.pull(missing)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{server.url}/{REPO}/resolve/main/extra.bin: HTTP {code}")


def test_network_error_is_a_model_error(server, monkeypatch):
    server.stop()
    with pytest.raises(ModelError, match="download failed"):
        hub.pull(MANIFEST)
    server.start()  # the fixture stops it again


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_offline_mode_refuses_before_any_request(server, monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    with pytest.raises(ModelError, match=r"offline mode \(HF_HUB_OFFLINE=1\): cannot download tiny-vlm"):
        hub.pull(MANIFEST)
    assert server.requests == []


def test_offline_mode_accepts_a_complete_model(server, monkeypatch):
    snapshot = hub.pull(MANIFEST)
    seen = len(server.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.pull(MANIFEST) == snapshot
    assert len(server.requests) == seen


def test_unsafe_manifest_path_is_refused(server):
    evil = manifest_for({"../../escape.txt": b"x"})
    with pytest.raises(ModelError, match="unsafe file path"):
        hub.pull(evil)
    assert server.requests == []


def test_verify_reports_each_file(server):
    with pytest.raises(ModelError, match="ffai models pull tiny-vlm"):
        hub.verify(MANIFEST)
    snapshot = hub.pull(MANIFEST)
    assert checks(hub.verify(MANIFEST)) == [(path, "ok") for path in CONTENT]

    blob = (snapshot / WEIGHTS).resolve()
    data = bytearray(blob.read_bytes())
    data[0] ^= 0xFF
    blob.write_bytes(bytes(data))
    (snapshot / "sub/tokenizer.json").resolve().write_bytes(b"{}")
    (snapshot / "config.json").resolve().unlink()  # the link dangles: a missing file
    # config.json is gone, so the model is no longer found: point verify at the folder.
    assert checks(hub.verify(MANIFEST, snapshot)) == [
        ("config.json", "missing"),
        (WEIGHTS, "sha256 mismatch"),
        ("sub/tokenizer.json", "size mismatch"),
    ]


def test_pull_repairs_a_corrupt_blob(server):
    snapshot = hub.pull(MANIFEST)
    (snapshot / WEIGHTS).resolve().write_bytes(b"garbage")
    assert hub.pull(MANIFEST) == snapshot
    assert checks(hub.verify(MANIFEST)) == [(path, "ok") for path in CONTENT]


def test_verify_prefers_ffai_home(server, tmp_path):
    folder = models.ffai_home() / "models" / "tiny-vlm"
    for path, body in CONTENT.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(body)
    assert models.locate(MANIFEST) == folder
    assert checks(hub.verify(MANIFEST)) == [(path, "ok") for path in CONTENT]


def test_remote_shorter_than_the_partial_is_refused(server):
    server.cut_after[WEIGHTS] = 120_000
    with pytest.raises(ModelError):
        hub.pull(MANIFEST)
    server.add(REPO, "main", WEIGHTS, CONTENT[WEIGHTS][:100_000])
    with pytest.raises(ModelError, match="HTTP 416"):
        hub.pull(MANIFEST)
    assert not any(name.startswith(sha(WEIGHTS)) for name in blob_names())


def test_finished_partial_is_renamed_without_a_request(server):
    blobs = repo_dir() / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (sha(WEIGHTS) + ".incomplete")).write_bytes(CONTENT[WEIGHTS])
    snapshot = hub.pull(MANIFEST)
    assert not any(WEIGHTS in s.path for s in server.requests)
    assert (snapshot / WEIGHTS).read_bytes() == CONTENT[WEIGHTS]


# Files the manifest does not pin: the weights known by a sha256 prefix, a tokenizer by nothing.
TOKENIZER = "sub/tokenizer.json"


def unpinned_manifest(prefix: str | None = None) -> Manifest:
    files = (
        ModelFile("config.json", len(CONTENT["config.json"]), sha("config.json")),
        ModelFile(WEIGHTS, len(CONTENT[WEIGHTS]), None, prefix or sha(WEIGHTS)[:8]),
        ModelFile(TOKENIZER, None, None),
    )
    return Manifest("tiny-vlm", "smolvlm", REPO, "main", "Apache-2.0", "test checkpoint", files)


UNPINNED = unpinned_manifest()


def nothing_written_for(path: str) -> bool:
    """No blob, partial or snapshot link for ``path``'s content, and no record."""
    snapshot = models.hf_snapshot(REPO, "main")
    left = [n for n in blob_names() if n.startswith((sha(path), git_blob_sha1(CONTENT[path])))]
    return not left and not (snapshot / path).exists() and not (snapshot / verification.RECORD).exists()


@pytest.mark.parametrize("redirect", [None, "cross"])
def test_unpinned_files_are_checked_against_the_hubs_hash_and_recorded(server, redirect):
    server.redirect = redirect
    snapshot = hub.pull(UNPINNED)
    # huggingface_hub's question (HEAD) for the two files the manifest does not pin, and only them.
    assert sorted(server.heads()) == sorted(f"/{REPO}/resolve/main/{p}" for p in (WEIGHTS, TOKENIZER))
    for path, body in CONTENT.items():
        assert (snapshot / path).read_bytes() == body
    assert blob_names() == sorted(sha(p) for p in CONTENT)
    record = json.loads((snapshot / verification.RECORD).read_text())
    assert record["revision"] == "main" and record["hf_repo"] == REPO
    lines = record["files"]
    # A pinned file's line keeps what the hub announced for it too (it agreed with the pin).
    config_etag = git_blob_sha1(CONTENT["config.json"])
    assert (lines["config.json"]["against"], lines["config.json"]["hub"]) == ("manifest", config_etag)
    # An LFS file is announced by its sha256, another by its git blob sha1.
    assert (lines[WEIGHTS]["against"], lines[WEIGHTS]["hub"]) == ("hub", sha(WEIGHTS))
    assert (lines[TOKENIZER]["against"], lines[TOKENIZER]["hub"]) == ("hub", git_blob_sha1(CONTENT[TOKENIZER]))
    assert all(lines[p]["sha256"] == sha(p) and lines[p]["size"] == len(CONTENT[p]) for p in CONTENT)
    assert [(r.path, r.status, r.against) for r in hub.verify(UNPINNED)] == [
        ("config.json", "ok", "manifest"),
        (WEIGHTS, "ok", "hub"),
        (TOKENIZER, "ok", "hub"),
    ]
    assert verification.read_record(snapshot, UNPINNED)["config.json"]["hub"] == config_etag  # verify keeps it
    seen = len(server.requests)
    assert hub.pull(UNPINNED) == snapshot  # the record vouches for them: nothing is asked again
    assert len(server.requests) == seen


def test_hub_announcing_other_content_than_the_pin_is_refused_before_writing(server):
    other = "f" * 64
    server.announce[WEIGHTS] = other
    with pytest.raises(ModelError) as info:
        hub.pull(MANIFEST)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{WEIGHTS}: the hub announces sha256 {other} at ")
    assert message.endswith(f"but the manifest pins {sha(WEIGHTS)}; nothing was written")
    assert nothing_written_for(WEIGHTS)


@pytest.mark.parametrize("path", [WEIGHTS, TOKENIZER])
def test_unpinned_download_unlike_the_hubs_hash_is_deleted(server, path):
    bad = bytearray(CONTENT[path])
    bad[3] ^= 0xFF
    server.add(REPO, "main", path, bytes(bad))  # same size; the hub still announces the original
    server.announce[path] = sha(path) if path == WEIGHTS else git_blob_sha1(CONTENT[path])
    with pytest.raises(ModelError) as info:
        hub.pull(UNPINNED)
    message = str(info.value)
    kind = "sha256 mismatch" if path == WEIGHTS else "git blob sha1 mismatch"
    assert message.startswith(f"{path}: {kind}") and message.endswith("the download was deleted")
    assert nothing_written_for(path)


def test_prefix_must_match_the_sha256_the_hub_announces(server):
    with pytest.raises(
        ModelError, match=r"not a sha256 beginning with the manifest's 00000000; nothing was downloaded"
    ):
        hub.pull(unpinned_manifest(prefix="00000000"))
    assert not any(s.method == "GET" and s.path.endswith(WEIGHTS) for s in server.requests)
    assert nothing_written_for(WEIGHTS)


def test_unpinned_file_the_hub_announces_no_hash_for_is_refused(server):
    server.announce[TOKENIZER] = None
    with pytest.raises(ModelError, match="the manifest pins no sha256 and the hub announced none"):
        hub.pull(UNPINNED)
    assert nothing_written_for(TOKENIZER)


def test_unpinned_weights_resume_under_the_announced_sha256(server):
    server.redirect = "cross"
    server.cut_after[WEIGHTS] = 120_000
    with pytest.raises(ModelError, match="run the pull again to resume"):
        hub.pull(UNPINNED)
    assert (repo_dir() / "blobs" / (sha(WEIGHTS) + ".incomplete")).stat().st_size == 120_000
    snapshot = hub.pull(UNPINNED)
    cdn = [s for s in server.requests if s.path.startswith("/cdn/") and s.method == "GET"]
    assert cdn[-1].headers["Range"] == "bytes=120000-" and set(server.ranges()) == {"bytes=120000-"}
    assert (snapshot / WEIGHTS).read_bytes() == CONTENT[WEIGHTS]


def test_verify_keeps_the_hubs_hash_when_a_file_goes_bad_and_pull_repairs_it(server):
    snapshot = hub.pull(UNPINNED)
    blob = (snapshot / TOKENIZER).resolve()
    blob.write_bytes(blob.read_bytes().replace(b"1.0", b"2.0"))  # same size, other content
    weights = (snapshot / WEIGHTS).resolve()
    weights.write_bytes(b"\0" + weights.read_bytes()[1:])
    assert checks(hub.verify(UNPINNED)) == [
        ("config.json", "ok"),
        (WEIGHTS, "sha256 mismatch"),  # its prefix no longer matches
        (TOKENIZER, "hub hash mismatch"),
    ]
    recorded = verification.read_record(snapshot, UNPINNED)
    assert recorded[TOKENIZER]["hub"] == git_blob_sha1(CONTENT[TOKENIZER]) and recorded[WEIGHTS]["sha256"] == sha(
        WEIGHTS
    )
    hub.pull(UNPINNED)
    assert checks(hub.verify(UNPINNED)) == [(path, "ok") for path in CONTENT]


def test_verify_has_no_hash_for_an_unpinned_file_nothing_checked(server):
    folder = models.ffai_home() / "models" / "tiny-vlm"
    for path, body in CONTENT.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(body)
    assert checks(hub.verify(UNPINNED)) == [
        ("config.json", "ok"),
        (WEIGHTS, "no hash known"),
        (TOKENIZER, "no hash known"),
    ]
    assert verification.read_record(folder, UNPINNED).keys() == {"config.json"}


def test_verify_a_snapshot_huggingface_hub_downloaded(server, monkeypatch):
    """A copy huggingface_hub (transformers) downloaded has no record of ours: its blob names are
    the hashes the hub announced (this server, as huggingface_hub reads it), which verify uses."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    server.redirect = "cross"
    for path in CONTENT:
        huggingface_hub.hf_hub_download(
            REPO, path, revision="main", cache_dir=str(models.hf_hub_cache()), endpoint=server.url
        )
    snapshot = models.locate(UNPINNED)
    assert os.readlink(snapshot / TOKENIZER).endswith(git_blob_sha1(CONTENT[TOKENIZER]))
    assert [(r.status, r.against) for r in hub.verify(UNPINNED)] == [("ok", "manifest"), ("ok", "hub"), ("ok", "hub")]
    assert verification.read_record(snapshot, UNPINNED)[TOKENIZER]["hub"] == git_blob_sha1(CONTENT[TOKENIZER])
    seen = len(server.requests)
    assert hub.pull(UNPINNED) == snapshot
    assert len(server.requests) == seen


def test_a_record_vouches_only_for_its_own_model_and_revision(server):
    snapshot = hub.pull(UNPINNED)
    folder = models.ffai_home() / "models" / "tiny-vlm"
    shutil.copytree(snapshot, folder)  # real files (links followed) and the record: no blob names to fall back on
    assert checks(hub.verify(UNPINNED, folder)) == [(path, "ok") for path in CONTENT]
    other = dataclasses.replace(UNPINNED, revision="0" * 40)
    assert checks(hub.verify(other, folder)) == [
        ("config.json", "ok"),
        (WEIGHTS, "no hash known"),
        (TOKENIZER, "no hash known"),
    ]


def test_a_renamed_repository_is_followed_to_the_hubs_answer(server):
    """The hub answers a renamed repository with a relative redirect; huggingface_hub follows it
    for metadata, and so does pull, taking the hash from the answer after it (the CDN redirect)."""
    server.redirect = "cross"
    for path, body in CONTENT.items():
        server.add("new-org/tiny-vlm", "main", path, body)
    server.renamed[REPO] = "new-org/tiny-vlm"
    snapshot = hub.pull(UNPINNED)
    heads = sorted(s.path for s in server.requests if s.method == "HEAD")
    assert heads == sorted(
        f"/{org}/tiny-vlm/resolve/main/{p}" for org in ("test-org", "new-org") for p in (WEIGHTS, TOKENIZER)
    )
    assert verification.read_record(snapshot, UNPINNED)[WEIGHTS]["hub"] == sha(WEIGHTS)
    assert checks(hub.verify(UNPINNED)) == [(path, "ok") for path in CONTENT]
