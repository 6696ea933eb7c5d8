"""What ``-i`` names: files, folders, quoted globs and ``@list`` files, expanded into the
run's inputs in a stable order, each with the root it was found under (``{reldir}`` in an
output pattern is the input's folder relative to that root).

- A file is itself; its root is the working folder when the file is below it (so ``{reldir}``
  is the folder as given: ``a/clip.mp4`` and ``b/clip.mp4`` stay apart), else its own folder.
- A folder is every regular, non-hidden file below it (hidden folders are not entered), in
  sorted order, except caption tracks (the extensions ffai writes), so outputs written into
  the tree are not read back as inputs. Files are not probed here: probing every file of a
  large tree before the first caption would be slow, and a file ffai cannot read is reported
  by the probe in the backend like any bad input, never skipped in silence.
- A glob (``*``, ``?``, ``[``; ``**`` recurses) is expanded by ffai, sorted; a folder it
  matches is taken as a folder. A glob that matches nothing is an error. A path that exists is
  taken literally even when its name holds glob characters.
- ``@list.txt``: one path per line, ``#`` comments and blank lines skipped; each line is a file,
  folder or glob as above. Relative lines are relative to the list file's folder, so a list
  means the same from any working directory. The root of a list's inputs is the deepest folder
  holding all of them.
- ``-`` (stdin) and URLs (anything with ``://``) pass through untouched; a ``file://`` URL is
  the file it names for output patterns and ``--resume`` (``Input.path``).

The same file named twice (by two globs, a folder and a file ...) is captioned once, where it
first appears.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from ffai.errors import UsageError
from ffai.media import local_path
from ffai.outputs.tracks import FORMATS

# A folder's files of these kinds are tracks (ffai's own outputs), not media.
TRACK_EXTENSIONS = frozenset("." + fmt for fmt in FORMATS)
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Input:
    source: str  # what the backend opens: a path, "-" or a URL
    root: str  # the folder ``{reldir}`` is relative to

    @property
    def path(self) -> str | None:
        """The file this input is on this machine (a ``file://`` URL's path), None for a stream."""
        path = local_path(self.source)
        return None if path is None else str(path)


def is_stream(spec: str) -> bool:
    """``-`` or a URL: not a path ffai can list or glob."""
    return spec == "-" or "://" in spec


def expand(specs: Sequence[str]) -> list[Input]:
    """Every input the ``-i`` values name, in order, each once."""
    seen: set[str] = set()
    inputs = []
    for spec in specs:
        for item in _expand_one(spec):
            key = os.path.realpath(item.path) if item.path else item.source
            if key not in seen:
                seen.add(key)
                inputs.append(item)
    return inputs


def _expand_one(spec: str) -> list[Input]:
    if is_stream(spec):
        path = local_path(spec)
        return [Input(spec, _file_root(str(path)) if path else "")]
    if spec.startswith("@") and len(spec) > 1:
        return _from_list(spec[1:])
    return _from_path(spec, base=None)


def _from_path(spec: str, base: str | None) -> list[Input]:
    path = os.path.expanduser(spec)
    if base is not None and not os.path.isabs(path):
        path = os.path.join(base, path)
    if os.path.isdir(path):
        return _from_folder(path)
    if os.path.lexists(path) or not (_GLOB_CHARS & set(spec)):
        return [Input(path, _file_root(path))]  # a missing file fails alone, in its probe
    return _from_glob(spec, path)


def _file_root(path: str) -> str:
    here = os.getcwd()
    folder = os.path.dirname(os.path.abspath(path))
    return "." if os.path.commonpath([here, folder]) == here else os.path.dirname(path)


def _from_folder(folder: str) -> list[Input]:
    files = _files_below(folder)
    if not files:
        raise UsageError(f"{folder}: no file to caption in this folder")
    return [Input(f, folder) for f in files]


def _files_below(folder: str) -> list[str]:
    found = []
    for parent, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            path = os.path.join(parent, name)
            if not name.startswith(".") and os.path.isfile(path) and not _is_track(name):
                found.append(path)
    # Sorted by path components, not as strings ("b/2.mp4" before "b10"), so each folder's
    # files stay together, in the same order on every filesystem.
    return sorted(found, key=lambda p: os.path.relpath(p, folder).split(os.sep))


def _is_track(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in TRACK_EXTENSIONS


def _from_glob(spec: str, pattern: str) -> list[Input]:
    root = _fixed_prefix(pattern)
    found = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        if os.path.isdir(match):
            found += [Input(f, root) for f in _files_below(match)]
        elif os.path.isfile(match):
            found.append(Input(match, root))
    if not found:
        raise UsageError(f"no file matches {spec!r}")
    return found


def _fixed_prefix(pattern: str) -> str:
    """The folders of ``pattern`` before its first glob character: where the matches are rooted."""
    parts = pattern.split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if _GLOB_CHARS & set(part):
            break
        fixed.append(part)
    prefix = os.sep.join(fixed)
    return prefix if prefix or not pattern.startswith(os.sep) else os.sep


def _from_list(list_path: str) -> list[Input]:
    try:
        with open(os.path.expanduser(list_path), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"@{list_path}: cannot read the list ({getattr(e, 'strerror', None) or e})") from e
    base = os.path.dirname(os.path.expanduser(list_path))
    entries = [line.strip() for line in lines]
    found = []
    for entry in entries:
        if not entry or entry.startswith("#"):
            continue
        if is_stream(entry):
            found.append(Input(entry, ""))
        else:
            found += _from_path(entry, base=base or ".")
    if not found:
        raise UsageError(f"@{list_path}: the list names no input")
    root = _common_folder(item.path for item in found if item.path)
    return [Input(item.source, root) if item.path else item for item in found]


def _common_folder(paths: Iterable[str]) -> str:
    folders = [os.path.dirname(os.path.abspath(p)) for p in paths]
    return os.path.commonpath(folders) if folders else ""


def reldir(item: Input) -> str:
    """The input's folder relative to its root (``.`` at the root itself)."""
    if not item.path:
        return "."
    return os.path.relpath(os.path.dirname(os.path.abspath(item.path)), os.path.abspath(item.root or "."))
