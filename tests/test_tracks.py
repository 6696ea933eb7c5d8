"""Caption track writers: golden files for every format, re-parsing with the format's own
library, atomic publication (DESIGN §6), and the cheap output checks.

Regenerate the golden files (then read the diff!) with ``FFAI_UPDATE_GOLDEN=1 pytest tests/test_tracks.py``.
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import srt
import webvtt

import sheet_reader
from ffai.errors import OutputError, UsageError
from ffai.outputs.cues import Cue, TrackHeader
from ffai.outputs.tracks import FORMATS, check_output, fold_line_breaks, open_track, resolve_format
from ffai.run.windows import Window

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("FFAI_UPDATE_GOLDEN") == "1"

HEADER = TrackHeader(
    source_path="clips/straße.mp4",
    duration=3725.0,
    width=640,
    height=360,
    engine="smolvlm",
    model="SmolVLM-256M-Instruct",
    fps=2.0,
    window=4,
    prompt="Describe the scene.",
    max_new_tokens=64,
    seed=None,
)

CUES = [
    Cue(1, 0, 2000, (0, 500, 1000, 1500), "A man walks a dog across the street."),
    Cue(2, 2000, 4000, (2000, 2500, 3000, 3500), "Café crème — 東京の夜景 🌃"),
    # an answer with CR CR LF, blank lines (one of spaces) and runs of spaces inside lines
    Cue(3, 4000, 5500, (4000, 4500, 5000), "First line\r\r\n\n \n  Second  line,   spaced  \r\nThird\tline\n"),
    Cue(4, 5500, 6000, (5500,), "Tom & Jerry <3 --> chase"),
    Cue(5, 6000, 6250, (6000,), ""),
    Cue(6, 3723456, 3725000, (3723456, 3724000), "Past the first hour."),
]

# what an srt/vtt cue shows: each run of line breaks (blank lines and the spaces around them) is one "\n"
SHOWN = [
    "A man walks a dog across the street.",
    "Café crème — 東京の夜景 🌃",
    "First line\nSecond  line,   spaced\nThird\tline",
    "Tom & Jerry <3 --> chase",
    "",
    "Past the first hour.",
]


def write_track(path, fmt, cues=CUES, overwrite=False):
    with open_track(str(path), fmt, HEADER, overwrite=overwrite) as writer:
        for cue in cues:
            writer.write(cue)


def parse(fmt: str, text: str) -> list[tuple[int, int, str]]:
    """(start_ms, end_ms, text) per cue, read back by each format's own reader."""
    if fmt == "srt":
        return [
            (s.start // timedelta(milliseconds=1), s.end // timedelta(milliseconds=1), s.content)
            for s in srt.parse(text)
        ]
    if fmt == "vtt":
        return [
            (c.start_time.in_milliseconds(), c.end_time.in_milliseconds(), html.unescape(c.raw_text))
            for c in webvtt.from_string(text, strict=True)
        ]
    if fmt == "json":
        return [(round(c["start"] * 1000), round(c["end"] * 1000), c["text"]) for c in json.loads(text)["cues"]]
    if fmt == "html":
        return [(c.start_ms, c.end_ms, c.text) for c in sheet_reader.cards(text)]
    if fmt == "jsonl":
        assert text == "" or text.endswith("\n")
        return [
            (round(c["start"] * 1000), round(c["end"] * 1000), c["text"]) for c in map(json.loads, text.splitlines())
        ]
    rows = []
    for line in text.split("\n")[:-1]:
        m = re.fullmatch(r"\[(\d{2,}):(\d\d):(\d\d)\.(\d{3}) --> (\d{2,}):(\d\d):(\d\d)\.(\d{3})\](?: (.*))?", line)
        assert m, line
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, m.groups()[:8])
        rows.append(((h1 * 3600 + m1 * 60 + s1) * 1000 + ms1, (h2 * 3600 + m2 * 60 + s2) * 1000 + ms2, m[9] or ""))
    return rows


def expected(fmt: str, cues=CUES) -> list[tuple[int, int, str]]:
    texts = {c.index: c.text for c in CUES}
    shown = {c.index: s for c, s in zip(CUES, SHOWN)}
    if fmt in ("json", "jsonl"):
        return [(c.start_ms, c.end_ms, texts[c.index]) for c in cues]
    if fmt == "html":  # exactly, but for CR LF and CR, which HTML reads as LF
        return [(c.start_ms, c.end_ms, re.sub(r"\r\n?", "\n", texts[c.index])) for c in cues]
    if fmt == "txt":
        return [(c.start_ms, c.end_ms, shown[c.index].replace("\n", " ")) for c in cues]
    return [(c.start_ms, c.end_ms, shown[c.index]) for c in cues]


def render(fmt: str, cues) -> str:
    """The track as a stream gets it (the same text as the file)."""
    stream = io.StringIO()
    with open_track("-", fmt, HEADER, overwrite=False, stream=stream) as writer:
        for cue in cues:
            writer.write(cue)
    return stream.getvalue()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


# --- golden files and re-parsing --------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_file(tmp_path, fmt):
    out = tmp_path / f"track.{fmt}"
    write_track(out, fmt)
    golden = GOLDEN / f"track.{fmt}"
    if UPDATE:
        golden.write_bytes(out.read_bytes())
    assert out.read_bytes() == golden.read_bytes()
    assert os.listdir(tmp_path) == [out.name]


@pytest.mark.parametrize("fmt", FORMATS)
def test_stdout_matches_the_golden_file(fmt):
    stream = io.StringIO()
    with open_track("-", fmt, HEADER, overwrite=False, stream=stream) as writer:
        for cue in CUES:
            writer.write(cue)
    assert stream.getvalue().encode("utf-8") == (GOLDEN / f"track.{fmt}").read_bytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_file_reads_back(fmt):
    assert parse(fmt, (GOLDEN / f"track.{fmt}").read_text(encoding="utf-8")) == expected(fmt)


def test_srt_reads_back_with_indices():
    subs = list(srt.parse((GOLDEN / "track.srt").read_text(encoding="utf-8")))
    assert [s.index for s in subs] == [c.index for c in CUES]
    assert subs[-1].start == timedelta(hours=1, minutes=2, seconds=3, milliseconds=456)


def test_vtt_is_what_webvtt_writes_for_the_whole_document(tmp_path):
    captions = webvtt.read(str(GOLDEN / "track.vtt")).captions
    assert [c.start for c in captions][-1] == "01:02:03.456"
    rebuilt = webvtt.WebVTT(captions=captions).content
    assert rebuilt.encode("utf-8") == (GOLDEN / "track.vtt").read_bytes()


def test_json_document_shape():
    doc = json.loads((GOLDEN / "track.json").read_text(encoding="utf-8"))
    assert doc["version"] == 1
    assert doc["source"] == {"path": "clips/straße.mp4", "duration": 3725.0, "width": 640, "height": 360}
    assert doc["engine"] == {"name": "smolvlm", "model": "SmolVLM-256M-Instruct"}
    assert doc["params"] == {
        "fps": 2.0,
        "window": 4,
        "prompt": "Describe the scene.",
        "max_new_tokens": 64,
        "seed": None,
    }
    assert doc["cues"][-1] == {
        "index": 6,
        "start": 3723.456,
        "end": 3725.0,
        "frame_times": [3723.456, 3724.0],
        "text": "Past the first hour.",
    }
    assert "東京" in (GOLDEN / "track.json").read_text(encoding="utf-8")  # ensure_ascii=False


@pytest.mark.parametrize("fmt, empty", [("srt", ""), ("vtt", "WEBVTT\n"), ("jsonl", ""), ("txt", "")])
def test_empty_track_is_a_valid_file(tmp_path, fmt, empty):
    out = tmp_path / f"empty.{fmt}"
    write_track(out, fmt, cues=[])
    assert out.read_text(encoding="utf-8") == empty
    assert parse(fmt, empty) == []


def test_empty_json_track(tmp_path):
    out = tmp_path / "empty.json"
    write_track(out, "json", cues=[])
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["cues"] == [] and doc["version"] == 1


def test_cue_from_window_rounds_once_to_ms():
    window = Window(index=4, frames=(), start=0.1 + 0.2, end=1 / 3)
    cue = Cue.from_window(window, "x")
    assert (cue.index, cue.start_ms, cue.end_ms, cue.text) == (5, 300, 333, "x")

    class Frame:
        def __init__(self, time):
            self.time = time

    window = Window(index=0, frames=(Frame(3723.4564), Frame(3723.9996)), start=3723.4564, end=3724.5)
    assert Cue.from_window(window, "").frame_times_ms == (3723456, 3724000)


def test_cue_refuses_negative_or_reversed_times():
    with pytest.raises(ValueError):
        Cue(1, -1, 0, (), "")
    with pytest.raises(ValueError):
        Cue(1, 10, 5, (), "")


# --- atomic publication --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_write_leaves_a_complete_file(tmp_path, fmt):
    out = tmp_path / f"track.{fmt}"
    inodes = []
    with open_track(str(out), fmt, HEADER, overwrite=False) as writer:
        assert not out.exists()  # nothing is created before the first cue
        for n, cue in enumerate(CUES, 1):
            writer.write(cue)
            assert parse(fmt, out.read_text(encoding="utf-8")) == expected(fmt, CUES[:n])
            assert out.read_text(encoding="utf-8") == render(fmt, CUES[:n])
            assert leftovers(tmp_path) == []
            inodes.append(out.stat().st_ino)
    assert os.listdir(tmp_path) == [out.name]
    # json and html are renamed into place at every cue (a new file each time; inode numbers
    # may be recycled, so compare neighbours); the others are created once, then appended to
    renamed = [a != b for a, b in zip(inodes, inodes[1:])]
    assert renamed == [fmt in ("json", "html")] * (len(CUES) - 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_abort_without_cues_creates_nothing(tmp_path, fmt):
    out = tmp_path / f"track.{fmt}"
    with pytest.raises(RuntimeError):
        with open_track(str(out), fmt, HEADER, overwrite=False):
            raise RuntimeError("model failed")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_existing_target_is_replaced_only_at_the_first_cue(tmp_path, fmt):
    out = tmp_path / f"track.{fmt}"
    out.write_bytes(b"precious")
    writer = open_track(str(out), fmt, HEADER, overwrite=True)
    assert out.read_bytes() == b"precious"
    writer.abort()  # a run failing before its first cue leaves the old file alone
    assert out.read_bytes() == b"precious"

    with open_track(str(out), fmt, HEADER, overwrite=True) as writer:
        assert out.read_bytes() == b"precious"
        writer.write(CUES[0])
        assert parse(fmt, out.read_text(encoding="utf-8")) == expected(fmt, CUES[:1])
    assert os.listdir(tmp_path) == [out.name]


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_track_replaces_an_existing_file_at_close(tmp_path, fmt):
    out = tmp_path / f"track.{fmt}"
    out.write_bytes(b"old")
    writer = open_track(str(out), fmt, HEADER, overwrite=True)
    assert out.read_bytes() == b"old"
    writer.close()
    assert parse(fmt, out.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_abort_after_cues_keeps_them(tmp_path, fmt):
    out = tmp_path / f"track.{fmt}"
    with pytest.raises(KeyboardInterrupt):
        with open_track(str(out), fmt, HEADER, overwrite=False) as writer:
            writer.write(CUES[0])
            writer.write(CUES[1])
            raise KeyboardInterrupt
    assert parse(fmt, out.read_text(encoding="utf-8")) == expected(fmt, CUES[:2])
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fmt, finished", [("srt", 0), ("html", 1)])
@pytest.mark.parametrize("at", ["open", "fdopen"])
def test_ctrl_c_as_the_temporary_file_is_made_leaves_none(tmp_path, monkeypatch, fmt, finished, at):
    """SIGINT raises KeyboardInterrupt between any two steps, also just after the temporary file
    exists: before its name is returned (``open``) or before it is wrapped (``fdopen``). srt
    publishes at its first cue (then appends), html at every cue."""
    out = tmp_path / f"track.{fmt}"
    real = getattr(os, at)

    def interrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        if at == "fdopen" or str(args[0]).endswith(".part"):
            raise KeyboardInterrupt
        return result

    with pytest.raises(KeyboardInterrupt):
        with open_track(str(out), fmt, HEADER, overwrite=False) as writer:
            for cue in CUES[:finished]:
                writer.write(cue)
            monkeypatch.setattr(os, at, interrupted)
            writer.write(CUES[finished])
    monkeypatch.undo()
    assert leftovers(tmp_path) == []
    if finished:
        assert parse(fmt, out.read_text(encoding="utf-8")) == expected(fmt, CUES[:finished])
    else:
        assert not out.exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_target_appearing_after_open_is_not_clobbered(tmp_path, fmt):
    out = tmp_path / f"track.{fmt}"
    writer = open_track(str(out), fmt, HEADER, overwrite=False)
    out.write_bytes(b"someone else's")
    with pytest.raises(OutputError, match="already exists"):
        writer.write(CUES[0])
    writer.abort()
    assert out.read_bytes() == b"someone else's"
    assert leftovers(tmp_path) == []


def test_an_existing_target_named_through_a_missing_folder_needs_y(tmp_path):
    """``missing/../track.srt`` is the file the sink would write (``..`` drops the missing folder):
    it exists, so it is not replaced without -y."""
    out = tmp_path / "track.srt"
    out.write_bytes(b"keep me")
    with pytest.raises(OutputError, match="already exists"):
        open_track(str(tmp_path / "missing" / ".." / "track.srt"), "srt", HEADER, overwrite=False)
    assert out.read_bytes() == b"keep me"


@pytest.mark.parametrize("fmt", ["srt", "vtt", "jsonl", "txt"])
def test_a_failed_append_is_rolled_back(tmp_path, fmt):
    """A disk filling up in the middle of a cue leaves the finished cues, not half a cue."""
    out = tmp_path / f"track.{fmt}"
    writer = open_track(str(out), fmt, HEADER, overwrite=False)
    writer.write(CUES[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (out.stat().st_size + 10, hard))
    try:
        with pytest.raises(OutputError, match="File too large"):
            writer.write(CUES[1])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    writer.abort()
    assert out.read_text(encoding="utf-8") == render(fmt, CUES[:1])


def test_write_after_close_is_a_bug(tmp_path):
    writer = open_track(str(tmp_path / "a.srt"), "srt", HEADER, overwrite=False)
    writer.close()
    writer.abort()  # no-op once closed
    with pytest.raises(ValueError):
        writer.write(CUES[0])


def test_symlinked_target_is_written_through(tmp_path):
    real = tmp_path / "real.srt"
    real.write_text("old")
    link = tmp_path / "link.srt"
    link.symlink_to(real)
    write_track(link, "srt", CUES[:1], overwrite=True)
    assert link.is_symlink()
    assert parse("srt", real.read_text(encoding="utf-8")) == expected("srt", CUES[:1])


def test_device_output_needs_no_overwrite_flag():
    check_output(os.devnull, overwrite=False)
    write_track(os.devnull, "srt", CUES[:2])
    assert Path(os.devnull).exists()


KILL_SCRIPT = textwrap.dedent("""
    import os, signal
    from test_tracks import CUES, HEADER
    from ffai.outputs.tracks import FORMATS, open_track
    for fmt in FORMATS:
        writer = open_track(os.path.join({folder!r}, "track." + fmt), fmt, HEADER, overwrite=False)
        for cue in CUES[:3]:
            writer.write(cue)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no abort, no atexit
""")


def test_a_killed_run_leaves_valid_files(tmp_path):
    script = KILL_SCRIPT.format(folder=str(tmp_path))
    # The child imports this module by name.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    for fmt in FORMATS:
        assert parse(fmt, (tmp_path / f"track.{fmt}").read_text(encoding="utf-8")) == expected(fmt, CUES[:3])
    assert leftovers(tmp_path) == []


# --- streams ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["srt", "vtt", "jsonl", "txt"])
def test_stream_gets_each_cue_as_it_comes(fmt):
    stream = io.StringIO()
    with open_track(None, fmt, HEADER, overwrite=False, stream=stream) as writer:
        for n, cue in enumerate(CUES, 1):
            writer.write(cue)
            assert parse(fmt, stream.getvalue()) == expected(fmt, CUES[:n])


def test_json_on_a_stream_is_printed_once_at_close():
    stream = io.StringIO()
    with open_track("-", "json", HEADER, overwrite=False, stream=stream) as writer:
        writer.write(CUES[0])
        assert stream.getvalue() == ""
    assert parse("json", stream.getvalue()) == expected("json", CUES[:1])


def test_json_on_a_stream_keeps_finished_cues_on_abort():
    stream = io.StringIO()
    open_track("-", "json", HEADER, overwrite=False, stream=stream).abort()
    assert stream.getvalue() == ""
    writer = open_track("-", "json", HEADER, overwrite=False, stream=stream)
    writer.write(CUES[0])
    writer.abort()
    assert parse("json", stream.getvalue()) == expected("json", CUES[:1])


# --- format and output checks ---------------------------------------------------------


@pytest.mark.parametrize(
    "output, fmt, want",
    [
        ("a.srt", None, "srt"),
        ("a.VTT", None, "vtt"),
        ("dir.x/a.json", None, "json"),
        ("a.jsonl", None, "jsonl"),
        ("a.txt", None, "txt"),
        ("a.srt", "json", "json"),
        ("-", None, "txt"),
        (None, None, "txt"),
        ("-", "jsonl", "jsonl"),
        (None, "SRT", "srt"),
        ("a.mp4", "vtt", "vtt"),
    ],
)
def test_resolve_format(output, fmt, want):
    assert resolve_format(output, fmt) == want


@pytest.mark.parametrize(
    "output, fmt, message",
    [
        ("a.mp4", None, "a.mp4: cannot tell the track format from extension '.mp4'"),
        ("captions", None, "captions: cannot tell the track format from no extension"),
        ("a.srt", "ass", "unknown format 'ass'"),
        ("-", "xml", "unknown format 'xml'"),
    ],
)
def test_resolve_format_errors(output, fmt, message):
    with pytest.raises(UsageError) as info:
        resolve_format(output, fmt)
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text
    assert "srt, vtt, json, jsonl, txt" in text


def test_check_output_accepts(tmp_path):
    check_output(None, overwrite=False)
    check_output("-", overwrite=False)
    check_output(str(tmp_path / "new.srt"), overwrite=False)
    (tmp_path / "old.srt").write_text("x")
    check_output(str(tmp_path / "old.srt"), overwrite=True)
    assert os.listdir(tmp_path) == ["old.srt"]  # checking creates nothing


def test_check_output_errors(tmp_path):
    (tmp_path / "old.srt").write_text("x")
    (tmp_path / "file").write_text("x")
    (tmp_path / "sub.srt").mkdir()
    cases = {
        str(tmp_path / "old.srt"): "old.srt: already exists (use -y to overwrite)",
        str(tmp_path / "sub.srt"): "sub.srt: is a directory",
        str(tmp_path / "missing" / "a.srt"): "a.srt: no such directory",
        str(tmp_path / "file" / "a.srt"): "a.srt: not a directory",
    }
    for output, message in cases.items():
        with pytest.raises(OutputError) as info:
            check_output(output, overwrite=False)
        assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(OutputError, match="is a directory"):
        check_output(str(tmp_path / "sub.srt"), overwrite=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_check_output_unwritable_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OutputError, match="not writable"):
        check_output(str(locked / "a.srt"), overwrite=False)


def test_open_track_checks_the_output_first(tmp_path):
    (tmp_path / "old.srt").write_text("x")
    with pytest.raises(OutputError, match="already exists"):
        open_track(str(tmp_path / "old.srt"), "srt", HEADER, overwrite=False)
    with pytest.raises(UsageError):
        open_track(str(tmp_path / "a.srt"), "ass", HEADER, overwrite=False)


STILL = TrackHeader(
    source_path="a.png",
    duration=None,
    width=4,
    height=3,
    engine="e",
    model="m",
    fps=None,
    window=None,
    prompt=None,
    max_new_tokens=8,
    seed=None,
)


def test_txt_of_a_still_is_the_answer_alone_line_breaks_kept(tmp_path):
    out = tmp_path / "a.txt"
    with open_track(str(out), "txt", STILL, overwrite=False) as writer:
        writer.write(Cue(index=1, start_ms=0, end_ms=0, frame_times_ms=(0,), text="a red\ncircle"))
    assert out.read_bytes().decode("utf-8") == "a red\ncircle\n"


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_still(tmp_path, fmt):
    """A still's track for an answer with CR CR LF, blank lines and runs of spaces: txt is the
    answer exactly (surrounding whitespace stripped), json/jsonl carry it exactly, srt/vtt fold."""
    cue = Cue(1, 0, 0, (0,), CUES[2].text)
    out = tmp_path / f"still.{fmt}"
    with open_track(str(out), fmt, STILL, overwrite=False) as writer:
        writer.write(cue)
    golden = GOLDEN / f"still.{fmt}"
    if UPDATE:
        golden.write_bytes(out.read_bytes())
    assert out.read_bytes() == golden.read_bytes()
    text = golden.read_bytes().decode("utf-8")  # as written: no newline translation
    if fmt == "txt":
        assert text == "First line\r\r\n\n \n  Second  line,   spaced  \r\nThird\tline\n"
    elif fmt in ("json", "jsonl"):
        assert parse(fmt, text) == [(0, 0, CUES[2].text)]
    elif fmt == "html":
        assert parse(fmt, text) == [(0, 0, re.sub(r"\r\n?", "\n", CUES[2].text))]
    else:
        assert parse(fmt, text) == [(0, 0, SHOWN[2])]


@pytest.mark.parametrize(
    "text, in_a_cue, on_a_line",
    [
        ("", "", ""),
        (" \r\n\t ", "", ""),
        ("one", "one", "one"),
        ("  two  words  ", "two  words", "two  words"),  # inner runs of spaces kept
        ("a\r\r\nb", "a\nb", "a b"),
        ("a\rb\nc\r\nd", "a\nb\nc\nd", "a b c d"),
        ("a  \n\n   \n\t b", "a\nb", "a b"),  # blank lines, and the spaces around breaks
        ("a\u2028b\x85c\x0cd\x0be", "a\nb\nc\nd\ne", "a b c d e"),  # what str.splitlines() splits at
        ("a\x1fb\u00a0c", "a\x1fb\u00a0c", "a\x1fb\u00a0c"),  # whitespace that is no line break stays
    ],
)
def test_fold_line_breaks(text, in_a_cue, on_a_line):
    assert fold_line_breaks(text, "\n") == in_a_cue
    assert fold_line_breaks(text, " ") == on_a_line
    assert in_a_cue.splitlines() == [line for line in in_a_cue.splitlines() if line.strip()]
