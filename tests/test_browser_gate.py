"""The gate on ``browser`` tests (tests/conftest.py): without chromium on PATH they skip with
one line naming the install command, and under ``CI=true`` they fail with that line instead.

chromium cannot be uninstalled for a test, so each case runs pytest in a subprocess on a tiny
generated test file, with this folder's conftest loaded as a plugin and a PATH that lacks
chromium (or holds a stand-in)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REASON = "no chromium on PATH: apt-get install chromium (or deselect with -m 'not browser')"

GENERATED = """
import pytest

@pytest.mark.browser
def test_in_a_browser(chromium):
    print("chromium at", chromium)

@pytest.mark.browser
def test_in_a_browser_without_the_fixture():
    pass

def test_without_a_browser():
    pass
"""


def run_gated(tmp_path: Path, path: str, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_generated.py").write_text(GENERATED, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env.update(PATH=path, PYTHONPATH=str(TESTS))
    if ci is not None:
        env["CI"] = ci
    # -p conftest: this folder's conftest, imported by name from PYTHONPATH (tmp_path has none).
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rA", "-s"]
    command += ["-W", "ignore::pytest.PytestUnknownMarkWarning", "test_generated.py"]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def without_chromium() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "chromium").exists())


def test_without_chromium_a_browser_test_skips_naming_the_install_command(tmp_path):
    done = run_gated(tmp_path, without_chromium(), ci=None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 2 skipped" in done.stdout
    # One summary line for all of them, the reason whole.
    (skipped,) = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped.startswith("SKIPPED [2] ") and skipped.endswith(f": {REASON}"), done.stdout


@pytest.mark.parametrize("ci", ["true", "TRUE"])
def test_under_ci_a_missing_chromium_fails_with_the_same_line(tmp_path, ci):
    done = run_gated(tmp_path, without_chromium(), ci=ci)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed, 2 errors" in done.stdout
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 2 and all(line.endswith(f"Failed: {REASON}") for line in errors), done.stdout
    assert "Traceback" not in done.stdout and "def require_chromium" not in done.stdout  # the one line alone


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_chromium_on_path_is_the_one_the_tests_launch(tmp_path, ci):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "chromium"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    done = run_gated(tmp_path, os.pathsep.join([str(bin_dir), without_chromium()]), ci=ci)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert f"chromium at {stand_in}" in done.stdout


def test_ci_other_than_true_does_not_require_it(tmp_path):
    done = run_gated(tmp_path, without_chromium(), ci="false")
    assert done.returncode == 0 and "1 passed, 2 skipped" in done.stdout, done.stdout + done.stderr
