"""The bench ledger: one JSON line appended per run, so runs can be compared over time.

A line holds when and where the run happened (versions, cores, the CPU's model and the flags
that decide which dtype is fast, the load average as the run started and ended, torch threads
per arm, git commit), what was run (model, dtype, repeats), each case's times, ratios, RSS and
precision figures (tokens left out: they are long and only matter through the gates), and the
gates. The default ledger is
``$FFAI_HOME/bench/ledger.jsonl`` (``~/.cache/ffai/bench/ledger.jsonl`` without FFAI_HOME),
read from the environment when the bench appends, not when this module is imported.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ffai.bench.checkpoints import CHECKOUT
from ffai.errors import OutputError
from ffai.models import ffai_home

if TYPE_CHECKING:  # pragma: no cover
    from ffai.kit.host import CpuInfo

PACKAGES = ("ffai", "torch", "transformers", "tokenizers", "av", "pillow")
REQUIRED_KEYS = (
    "time",
    "versions",
    "cores",
    "cpu",
    "load_average",
    "torch_threads",
    "git_commit",
    "model",
    "dtype",
    "repeats",
    "cases",
    "gates",
)


def default_ledger() -> Path:
    """``$FFAI_HOME/bench/ledger.jsonl``, where a run without ``--ledger`` appends."""
    return ffai_home() / "bench" / "ledger.jsonl"


def versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (nothing is imported)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_commit(repo: Path | None = CHECKOUT) -> str | None:
    """The checkout's commit, with ``+dirty`` when tracked files changed; None outside git (an
    installed wheel has no checkout)."""
    if repo is None:
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def cpu_identity(info: "CpuInfo | None" = None) -> dict:
    """The CPU's model name and the flags that decide which dtype runs fast (``ffai.kit.host``; this
    machine's unless ``info`` is given), as the report and the ledger record them."""
    from ffai.kit import host

    info = host.cpu_info() if info is None else info
    return {"model": info.model, "flags": list(info.relevant_flags)}


def load_average() -> float | None:
    """The machine's one-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def ledger_line(report: dict) -> dict:
    """The ledger's record of one bench report (see cli.run_bench)."""
    cases = {record["case"]: {k: v for k, v in record.items() if k != "case"} for record in report["cases"]}
    quality = report["quality"]
    if quality is not None:  # the answers themselves stay in the --json report
        quality = {
            k: v if k == "corpus" else {n: c for n, c in v.items() if n != "answers"} for k, v in quality.items()
        }
    return {
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "cores": report["cores"],
        "cpu": report["cpu"],
        "load_average": report["load_average"],
        "torch_threads": {
            r["case"]: {arm: r[arm]["torch_threads"] for arm in ("ffai", "reference")} for r in report["cases"]
        },
        "git_commit": git_commit(),
        "model": report["model"],
        "dtype": report["dtype"],
        "compile": report.get("compile", False),
        "batch": report.get("batch", 1),
        "busy": report.get("busy", 0),
        "repeats": report["repeats"],
        "cases": cases,
        "quality": quality,
        "gates": report["gates"],
    }


def append(path: Path | None, line: dict) -> None:
    """Append one JSON line to ``path`` (None: the default ledger); the file and its folder are
    created when missing."""
    path = default_ledger() if path is None else path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
    except OSError as e:
        raise OutputError(f"{path}: cannot append to the bench ledger: {e.strerror or e}") from e
