"""What a media source is and the checks every reader makes first: the records readers give
(``MediaInfo``, ``Frame``), how a source is named (standard input, URLs, live or not), and the
bounds on sizes and on the sampling flags."""

from __future__ import annotations

import math
import os
import re
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ffai.errors import MediaError, UsageError

# Largest width or height accepted, image or video; engines import it for the images they are handed.
MAX_SIDE = 16384
TIME_EPS = 1e-6  # seconds; finer than any real time base step (1/90000 s = 11 us)


@dataclass(frozen=True)
class MediaInfo:
    path: Path | str  # a live source keeps the name it was given ("-", a URL)
    kind: str  # "image" or "video"
    width: int  # display size: after rotation / EXIF orientation
    height: int
    duration: float | None  # seconds; None for images and live sources
    live: bool = False  # read as it arrives (is_live): no end known, no seeking


@dataclass(frozen=True)
class Frame:
    time: float  # seconds on the source timeline (see ffai.media)
    image: Image.Image  # upright; RGB8 for video, a still's own mode (see ffai.media)


STDIN = "-"
URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_live(source: str | Path) -> bool:
    """True for a source read as it arrives, whose end is not known in advance: standard input
    (``-``), a URL (``udp://``, ``tcp://``, ``http://`` ... but not ``file://``), or a path to a
    named pipe, a character device or a socket. A regular file is not live."""
    name = str(source)
    if name == STDIN:
        return True
    if URL_SCHEME.match(name):
        return is_url(name)
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def is_url(source: str | Path) -> bool:
    """True for a URL FFmpeg opens (``http://``, ``udp://`` ...), which any machine with the
    network can read, unlike standard input or a pipe on this one."""
    scheme = URL_SCHEME.match(str(source))
    return bool(scheme) and scheme.group(1).lower() != "file"


def source_label(source: str | Path) -> str:
    """How messages name a source: ``stdin`` for ``-``, else the name as given."""
    return "stdin" if str(source) == STDIN else str(source)


def path_of(source: str | Path) -> Path:
    """The path `source` names: a ``file://`` URL's path, percent-decoded (its host empty or
    ``localhost``: another machine's file is a MediaError), else `source` itself."""
    name = str(source)
    scheme = URL_SCHEME.match(name)
    if isinstance(source, Path) or not scheme or scheme.group(1).lower() != "file":
        return Path(source)
    url = urllib.parse.urlsplit(name)
    if url.netloc.lower() not in ("", "localhost"):
        raise MediaError(f"{name}: a file on {url.netloc}, not on this machine (file:///PATH names a local file)")
    if not url.path:
        raise MediaError(f"{name}: names no file (file:///PATH)")
    # Percent-decoded to bytes, then to a name as the filesystem spells it (any encoding).
    return Path(os.fsdecode(urllib.parse.unquote_to_bytes(url.path)))


def local_path(source: str | Path) -> Path | None:
    """The file `source` is on this machine (a path, or a ``file://`` URL's path), or None for
    standard input, a network URL or a ``file://`` URL naming another machine: what output
    patterns (``{stem}``), ``--resume`` and duplicate inputs go by."""
    name = str(source)
    if name == STDIN or is_url(name):
        return None
    try:
        return path_of(source)
    except MediaError:
        return None


def check_file(path: str | Path) -> Path:
    """The regular, non-empty file `path` names (a path or a ``file://`` URL, ``path_of``), or
    a MediaError saying why not."""
    file = path_of(path)
    if not file.exists():
        raise MediaError(f"{file}: no such file")
    if file.is_dir():
        raise MediaError(f"{file}: is a directory")
    if not file.is_file():
        raise MediaError(f"{file}: not a regular file")
    if file.stat().st_size == 0:
        raise MediaError(f"{file}: empty file")
    return file


def check_size(file: Path, width: int, height: int) -> tuple[int, int]:
    if width <= 0 or height <= 0:
        raise MediaError(f"{file}: invalid size {width}x{height}")
    if width > MAX_SIDE or height > MAX_SIDE:
        raise MediaError(f"{file}: {width}x{height} is too large (the limit is {MAX_SIDE} a side)")
    return width, height


def check_fps(fps: float) -> None:
    """The one rule for ``--fps`` (sampling and windows both divide by it)."""
    if not (math.isfinite(fps) and fps > 0):
        raise UsageError(f"--fps must be a number > 0, got {fps:g}")


def check_sampling(fps: float, start: float, duration: float | None, max_frames: int | None) -> None:
    """The one rule set for ``--fps``, ``-ss``, ``-t`` and ``--max-frames``, library and CLI alike."""
    check_fps(fps)
    if not (math.isfinite(start) and start >= 0):
        raise UsageError(f"-ss must be a number of seconds >= 0, got {start:g}")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise UsageError(f"-t must be a number of seconds > 0, got {duration:g}")
    if max_frames is not None and max_frames < 1:
        raise UsageError(f"--max-frames must be at least 1, got {max_frames}")
