"""The run record: one JSON line per event of a caption run over several inputs, appended and
flushed as it happens, so a killed run leaves a readable record and ``--resume`` knows what
finished.

Lines are of two kinds. ``{"kind": "run", ...}`` opens each run: when it started, its
fingerprint and the settings behind it. ``{"kind": "input", ...}`` follows an input: its path,
size and mtime, its output, the run's fingerprint, ``status`` (``running``, ``done``,
``failed``, ``interrupted``, ``skipped``), ``attempts``, ``error``, ``seconds`` and ``cues``
written. The last line about an (input, output) pair is its state.

The fingerprint is a hash of everything that decides an output's bytes: engine, model name
and the sha256 of every file of the model folder, sampling (fps, window, -ss, -t,
--max-frames), prompt and decoding options, dtype, device and the track format. Threads,
placement and in-flight limits are left out: they change the speed, not the tokens.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ffai import models
from ffai.errors import ModelError, OutputError
from ffai.media import local_path
from ffai.models import hub
from ffai.run.captioner import ResolvedModel
from ffai.run.options import CaptionOptions

DEFAULT_NAME = "ffai-run.jsonl"

# Which flag sets each fingerprinted setting, to name the one that changed between runs.
SETTING_FLAGS = {
    "engine": "--engine",
    "model": "--model",
    "model_files": "the model's files",
    "fps": "--fps",
    "window": "--window",
    "start": "-ss",
    "duration": "-t",
    "max_frames": "--max-frames",
    "prompt": "--prompt",
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "repetition_penalty": "--repetition-penalty",
    "stop": "--stop",
    "seed": "--seed",
    "window_as": "--window-as",
    "min_pixels": "--min-pixels",
    "max_pixels": "--max-pixels",
    "frame_min_pixels": "--frame-min-pixels",
    "frame_max_pixels": "--frame-max-pixels",
    "dtype": "--dtype",
    "device": "--device",
    "compile": "--compile",
    "format": "the track format (-f or -o's extension)",
}


def model_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file of a model folder, by relative path. A file a manifest pins, found
    at the size the manifest gives, takes the manifest's digest (``ffai models pull`` checked
    it, ``ffai models verify`` re-checks it), so the real model is not re-read on every run."""
    pinned: dict[str, tuple[int, str]] = {}
    for manifest in models.manifests():
        try:
            if models.locate(manifest).resolve() == folder.resolve():
                pinned = {f.path: (f.size, f.sha256) for f in manifest.files if f.sha256}
                break
        except ModelError:  # not on this machine: not the folder in use
            continue
    digests = {}
    # Hidden files and folders are left out: a download tool's own bookkeeping (huggingface_hub
    # keeps .cache/huggingface/ in a --local-dir) changes without the model changing.
    files = (p for p in folder.rglob("*") if p.is_file())
    for path in sorted(p for p in files if not any(part.startswith(".") for part in p.relative_to(folder).parts)):
        name = path.relative_to(folder).as_posix()
        size = path.stat().st_size
        if name in pinned and pinned[name][0] == size:
            digests[name] = pinned[name][1]
        else:
            digests[name] = hub.sha256_file(path)
    return digests


def settings(options: CaptionOptions, model: ResolvedModel, fmt: str) -> dict[str, Any]:
    """What decides the bytes of an output, as plain JSON values (see the module docstring)."""
    d = options.decoding
    files = model_digests(model.folder)
    # Only where given: a run from before --window-as (or the pixel budgets) existed then reads as
    # the same settings.
    optional = ("window_as", "min_pixels", "max_pixels", "frame_min_pixels", "frame_max_pixels")
    given = {key: getattr(d, key) for key in optional if getattr(d, key) is not None}
    if d.repetition_penalty != 1.0:  # likewise: named only when on
        given["repetition_penalty"] = d.repetition_penalty
    if d.stop:
        given["stop"] = list(d.stop)
    return {
        "engine": model.engine.info.name,
        "model": model.name,
        "model_files": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
        "fps": options.fps,
        "window": options.window,
        "start": options.start,
        "duration": options.duration,
        "max_frames": options.max_frames,
        "prompt": d.prompt,
        "max_new_tokens": d.max_new_tokens,
        "temperature": d.temperature,
        "top_p": d.top_p,
        "top_k": d.top_k,
        "seed": d.seed,
        "dtype": options.runtime.dtype,
        "device": options.runtime.device,
        # A compiled step rounds otherwise; named only when on, so earlier runs' records still match.
        **({"compile": True} if options.runtime.compile else {}),
        "format": fmt,
        **given,
    }


def fingerprint(values: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def changed_settings(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """The flags whose values differ between two runs' settings (all of them if ``old`` is unknown)."""
    if old is None:
        return ["the options"]
    keys = [k for k in new if old.get(k, object()) != new[k]] + [k for k in old if k not in new]
    return [SETTING_FLAGS.get(k, k) for k in keys] or ["the options"]


def file_identity(path: str) -> tuple[int | None, float | None]:
    """(size, mtime) of an input (a ``file://`` URL's file), or (None, None) for a stream or a
    missing file."""
    file = local_path(path)
    try:
        st = os.stat(file) if file is not None else None
    except (OSError, ValueError):
        return None, None
    if st is None:
        return None, None
    return st.st_size, st.st_mtime


@dataclass(frozen=True)
class Previous:
    """What an earlier run recorded about one (input, output) pair."""

    status: str
    fingerprint: str
    size: int | None
    mtime: float | None
    settings: dict[str, Any] | None  # of the run that wrote it, when its run line is there


def read(path: str) -> dict[tuple[str, str], Previous]:
    """The last state of each (absolute input, absolute output) pair a record holds. A line cut
    short by a kill, or not ffai's, is passed over."""
    runs: dict[str, dict[str, Any]] = {}
    last: dict[tuple[str, str], Previous] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise OutputError(f"{path}: cannot read the run record ({getattr(e, 'strerror', None) or e})") from e
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("kind") == "run" and isinstance(entry.get("settings"), dict):
            runs[str(entry.get("fingerprint"))] = entry["settings"]
        elif entry.get("kind") == "input" and entry.get("input") and entry.get("output"):
            fp = str(entry.get("fingerprint"))
            key = (_absolute(entry["input"]), _absolute(entry["output"]))
            last[key] = Previous(str(entry.get("status")), fp, entry.get("size"), entry.get("mtime"), runs.get(fp))
    return last


def _absolute(path: str) -> str:
    return path if "://" in path or path == "-" else os.path.abspath(path)


def key(source: str, output: str) -> tuple[str, str]:
    return _absolute(source), _absolute(output)


class RunLog:
    """Appends the record's lines; each is flushed and fsynced as it is written."""

    def __init__(self, path: str, settings: dict[str, Any]) -> None:
        self.path = path
        self.settings = settings
        self.fingerprint = fingerprint(settings)
        self._file: IO[str] | None = None

    def __enter__(self) -> RunLog:
        try:
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise OutputError(f"{self.path}: cannot write the run record ({e.strerror or e})") from e
        self._append({"kind": "run", "started": _now(), "fingerprint": self.fingerprint, "settings": self.settings})
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def input(self, source: str, output: str, status: str, **fields: Any) -> None:
        size, mtime = file_identity(source)
        entry = {
            "kind": "input",
            "time": _now(),
            "input": source,
            "output": output,
            "size": size,
            "mtime": mtime,
            "fingerprint": self.fingerprint,
            "status": status,
            **fields,
        }
        self._append(entry)

    def _append(self, entry: dict[str, Any]) -> None:
        assert self._file is not None, "the run log is not open"
        try:
            self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            raise OutputError(f"{self.path}: cannot write the run record ({e.strerror or e})") from e


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
