"""`ffai models pull` / `verify` end to end against a loopback hub (tests/hub_server.py)."""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest

from ffai import hub, models
from ffai.errors import ModelError
from ffai.models import Manifest, ModelFile
from hub_server import HubServer

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
    assert len(resolve) == len(cdn) == len(CONTENT)
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
