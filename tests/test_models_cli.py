"""``ffai models list|pull|verify`` and model lookup, through the CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ffai import models
from ffai.cli import run
from ffai.engines.smolvlm.bench.checkpoints import REFERENCE_DIR as SMOLVLM_FILES
from hub_server import HubServer

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = SMOLVLM_FILES


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("FFAI_HOME", str(tmp_path / "ffai"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path


def _fake_snapshot(tmp_path: Path) -> Path:
    """The real small files in the hub-cache layout, plus a model.safetensors that is wrong."""
    m = models.find_manifest("smolvlm-256m-instruct")
    repo = tmp_path / "hub" / ("models--" + m.hf_repo.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for f in m.files:
        if f.path != "model.safetensors":
            shutil.copy(REFERENCE / f.path, snap / f.path)
    (snap / "model.safetensors").write_bytes(b"not the weights")
    return snap


def test_list_json_reports_missing_then_found(isolated, capsys):
    assert run(["models", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    real = rows["smolvlm-256m-instruct"]
    assert real["path"] is None and real["license"] == "Apache-2.0" and real["size"] > 500_000_000
    snap = _fake_snapshot(isolated)
    assert run(["models", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["smolvlm-256m-instruct"]["path"] == str(snap)
    assert models.resolve("smolvlm-256m-instruct") == snap


def test_ffai_home_wins_over_hub_cache(isolated):
    _fake_snapshot(isolated)
    own = isolated / "ffai" / "models" / "smolvlm-256m-instruct"
    own.mkdir(parents=True)
    (own / "config.json").write_text("{}")
    assert models.resolve("smolvlm-256m-instruct") == own


def test_verify_flags_the_bad_file(isolated, capsys):
    _fake_snapshot(isolated)
    assert run(["models", "verify", "smolvlm-256m-instruct"]) == 1
    out, err = capsys.readouterr()
    assert "ok" in out and "model.safetensors" in out
    assert err.startswith("ffai: error:") and "1 of 12 files failed" in err


def test_verify_missing_model_names_pull(isolated, capsys):
    assert run(["models", "verify", "smolvlm-256m-instruct"]) == 1
    assert "ffai models pull smolvlm-256m-instruct" in capsys.readouterr().err


def test_pull_offline_is_refused(isolated, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run(["models", "pull", "smolvlm-256m-instruct"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ffai: error: offline mode")
    assert not (isolated / "hub").exists()


def test_unknown_model_name_is_usage_error(isolated, capsys):
    assert run(["models", "pull", "nope"]) == 2
    assert "no model named 'nope'" in capsys.readouterr().err


# The default model and what stands in for it, with real folders where each is looked for.
VIDEO = "smolvlm2-256m-video-instruct"


def _hub_snapshot(tmp_path: Path, name: str, commit: str, ref: str | None = None) -> Path:
    """A hub-cache snapshot of ``name`` holding a config.json (what lookup looks for)."""
    m = models.find_manifest(name)
    repo = tmp_path / "hub" / ("models--" + m.hf_repo.replace("/", "--"))
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    shutil.copy(REFERENCE / "config.json", snap / "config.json")
    return snap


def test_default_model_lookup_order(isolated, monkeypatch):
    from ffai.engines import registry
    from ffai.run.captioner import resolve_model
    from ffai.run.options import CaptionOptions

    monkeypatch.delenv("FFAI_MODEL", raising=False)
    assert registry.get_engine().info.default_model == VIDEO
    pull = f"`ffai models pull {VIDEO}`"

    name, note = models.default_model("smolvlm", VIDEO)
    assert name == "smolvlm-demo"
    assert note == (
        f"{VIDEO} is not on this machine; using the small bundled demo model smolvlm-demo (get the real one with {pull})"
    )

    # The video model at another revision than the manifest's is not it: the v1 model stands in.
    _hub_snapshot(isolated, VIDEO, "1" * 40, ref="main")
    v1 = _hub_snapshot(isolated, "smolvlm-256m-instruct", "0" * 40, ref="main")
    resolved = resolve_model(CaptionOptions())
    note = f"{VIDEO} is not on this machine; using smolvlm-256m-instruct (get {VIDEO} with {pull})"
    assert (resolved.name, resolved.folder, resolved.warnings[:1]) == ("smolvlm-256m-instruct", v1, (note,))
    assert f"ffai: warning: {note}\n" in (ROOT / "docs" / "models.md").read_text(encoding="utf-8")

    video = _hub_snapshot(isolated, VIDEO, models.find_manifest(VIDEO).revision)
    resolved = resolve_model(CaptionOptions())
    assert (resolved.name, resolved.folder) == (VIDEO, video)
    assert not any("not on this machine" in w for w in resolved.warnings)

    own = isolated / "ffai" / "models" / VIDEO
    own.mkdir(parents=True)
    (own / "config.json").write_text("{}")
    assert resolve_model(CaptionOptions()).folder == own  # $FFAI_HOME before the hub cache

    monkeypatch.setenv("FFAI_MODEL", "smolvlm-demo")
    assert models.default_model("smolvlm", VIDEO) == ("smolvlm-demo", None)


def test_pull_without_a_name_pulls_the_default_model(isolated, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run(["models", "pull"]) == 1
    assert capsys.readouterr().err == f"ffai: error: offline mode (HF_HUB_OFFLINE=1): cannot download {VIDEO}\n"


# pull, list and verify through the CLI against the loopback hub, with a manifest that pins one
# file, knows the weights by a sha256 prefix and the tokenizer by nothing.
HUB_REPO = "test-org/tiny-vlm"
FILES = {
    "config.json": b'{"model_type": "smolvlm"}',
    "model.safetensors": bytes(range(256)) * 1000,
    "tokenizer.json": b'{"version": "1.0"}',
}


def _sha(path: str) -> str:
    return hashlib.sha256(FILES[path]).hexdigest()


@pytest.fixture
def tiny_hub(isolated, monkeypatch):
    toml = isolated / "tiny-vlm.toml"
    toml.write_text(
        f"""name = "tiny-vlm"
engine = "smolvlm"
hf_repo = "{HUB_REPO}"
revision = "main"
license = "Apache-2.0"
description = "test checkpoint"

[[files]]
path = "config.json"
size = {len(FILES["config.json"])}
sha256 = "{_sha("config.json")}"

[[files]]
path = "model.safetensors"
size = {len(FILES["model.safetensors"])}
sha256_prefix = "{_sha("model.safetensors")[:8]}"

[[files]]
path = "tokenizer.json"
""",
        encoding="utf-8",
    )
    bundled = models.manifest_paths()
    monkeypatch.setattr(models, "manifest_paths", lambda: [*bundled, toml])
    server = HubServer(commit="ab" * 20, redirect="cross")
    for path, body in FILES.items():
        server.add(HUB_REPO, "main", path, body)
    server.start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield server
    server.stop()


def _left_behind(isolated: Path) -> list[str]:
    repo = isolated / "hub" / "models--test-org--tiny-vlm"
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if not p.is_dir()) if repo.exists() else []


def test_pull_list_verify_through_the_cli(tiny_hub, isolated, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # the table's cells on one line each
    assert run(["models", "list", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "tiny-vlm")
    assert (row["path"], row["pinned"], row["hub_verified"], row["size_known"]) == (None, 1, [], False)
    assert [f["pin"] for f in row["files"]] == ["sha256", "sha256-prefix", "none"]

    assert run(["models", "pull", "tiny-vlm"]) == 0
    snapshot = Path(capsys.readouterr().out.strip())
    assert snapshot == isolated / "hub" / "models--test-org--tiny-vlm" / "snapshots" / ("ab" * 20)
    assert all((snapshot / p).read_bytes() == body for p, body in FILES.items())

    assert run(["models", "list", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "tiny-vlm")
    assert row["path"] == str(snapshot) and row["hub_verified"] == ["model.safetensors", "tokenizer.json"]
    assert [f["verified"] for f in row["files"]] == ["manifest", "hub", "hub"]
    assert run(["models", "list"]) == 0
    table = capsys.readouterr().out
    assert "1/3, hub 2/2" in table and "12/12" in table  # tiny-vlm, and smolvlm-256m-instruct

    assert run(["models", "verify", "tiny-vlm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines] == [
        ["ok", "manifest", "config.json"],
        ["ok", "hub", "model.safetensors"],
        ["ok", "hub", "tokenizer.json"],
    ]
    (snapshot / "tokenizer.json").resolve().write_bytes(b'{"version": "2.0"}')
    assert run(["models", "verify", "tiny-vlm"]) == 1
    out, err = capsys.readouterr()
    assert "hub hash mismatch" in out and err == "ffai: error: tiny-vlm: 1 of 3 files failed verification\n"


@pytest.mark.parametrize("case", ["download unlike the hub's hash", "hub names other content than the pin"])
def test_hub_hash_mismatch_is_one_line_and_leaves_nothing(tiny_hub, isolated, capsys, case):
    if case == "download unlike the hub's hash":
        path = "model.safetensors"
        tiny_hub.add(HUB_REPO, "main", path, FILES[path][::-1])  # same size; still announced as the original
        tiny_hub.announce[path] = _sha(path)
        expected = f"ffai: error: {path}: sha256 mismatch (expected {_sha(path)}, found "
    else:
        path = "config.json"
        tiny_hub.announce[path] = "e" * 64
        expected = f"ffai: error: {path}: the hub announces sha256 {'e' * 64} at "
    assert run(["models", "pull", "tiny-vlm"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(expected) and err.count("\n") == 1 and out == ""
    # Nothing half-written: no partial, no blob or link for it, no record; at most whole verified blobs.
    left = _left_behind(isolated)
    assert not any(name.endswith(".incomplete") or name.startswith("snapshots/") for name in left), left
    assert f"blobs/{_sha(path)}" not in left and all(name.startswith(("blobs/", "refs/")) for name in left)
