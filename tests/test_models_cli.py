"""``ffai models list|pull|verify`` and model lookup, through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ffai import models
from ffai.cli import run

REFERENCE = Path(__file__).parent / "data" / "smolvlm-256m-instruct"


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
