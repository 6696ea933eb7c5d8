"""``-i file://…`` names a file (README): the track is the one the path itself gives, for a path
with spaces and non-ASCII characters percent-encoded, with or without ``localhost`` as the host;
a URL naming another machine's file, or a file that is not there, is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ffai.cli import run
from sample_media import make_clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("media") / "holiday clips" / "café ü 東京"
    folder.mkdir(parents=True)
    return make_clip(folder / "day #1 at 50%.mp4", 3, fps=10)


def caption(capsys, source: str, model: Path, *flags: str) -> tuple[int, str, str]:
    """``ffai caption -i SOURCE --fps 1 --window 2`` on the tiny checkpoint, JSON lines on stdout."""
    args = ["caption", "-i", source, "--model", str(model), "--fps", "1", "--window", "2"]
    code = run([*args, "--max-new-tokens", "6", "-f", "jsonl", "-o", "-", "--no-progress", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_file_url_captions_the_file_it_names(capsys, clip, tiny_checkpoint, tmp_path):
    url = clip.as_uri()
    assert all(code in url for code in ("%20", "%C3%A9", "%E6%9D%B1", "%23", "%25"))  # space, é, 東, #, %
    code, by_path, err = caption(capsys, str(clip), tiny_checkpoint)
    assert code == 0, err
    assert len(by_path.splitlines()) == 2  # 3 s at 1 fps in windows of 2
    for source in (url, url.replace("file://", "file://localhost", 1), url.replace("file://", "FILE://", 1)):
        code, out, err = caption(capsys, source, tiny_checkpoint)
        assert (code, out) == (0, by_path), err
    # A JSON track records the file's path, where its contact sheet finds the video.
    track = tmp_path / "track.json"
    code, _, err = caption(capsys, url, tiny_checkpoint, "-f", "json", "-o", str(track))
    assert code == 0, err
    assert json.loads(track.read_text(encoding="utf-8"))["source"]["path"] == str(clip)


def test_a_file_url_to_another_machine_or_no_file_is_one_line(capsys, tiny_checkpoint):
    code, out, err = caption(capsys, "file://elsewhere/clips/a.mp4", tiny_checkpoint)
    assert (code, out) == (1, "")
    assert err == (
        "ffai: error: file://elsewhere/clips/a.mp4: a file on elsewhere, not on this machine "
        "(file:///PATH names a local file)\n"
    )
    code, out, err = caption(capsys, "file:///no%20such/clip.mp4", tiny_checkpoint)
    assert (code, out) == (1, "")
    assert err == "ffai: error: file:///no%20such/clip.mp4: /no such/clip.mp4: no such file\n"


def test_a_file_url_fills_output_patterns_and_resumes_as_its_file(capsys, clip, tiny_checkpoint, tmp_path):
    """``{stem}``/``{parent}`` are the named file's, decoded (not the URL's text), and --resume
    knows the file: done and unchanged is skipped, touched is captioned again."""
    url = clip.as_uri()
    out = tmp_path / "tracks"
    out.mkdir()
    pattern = str(out / "{stem}.srt")
    record = str(tmp_path / "run.jsonl")
    code, _, err = caption(capsys, url, tiny_checkpoint, "-f", "srt", "-o", pattern, "--resume", "--run-log", record)
    assert code == 0, err
    track = out / "day #1 at 50%.srt"
    assert [p.name for p in out.iterdir()] == [track.name]
    first = track.read_bytes()
    track.write_bytes(b"kept")  # a skipped input's output is left alone
    code, _, err = caption(capsys, url, tiny_checkpoint, "-f", "srt", "-o", pattern, "--resume", "--run-log", record)
    assert code == 0, err
    assert track.read_bytes() == b"kept"
    clip.touch()  # changed since it was captioned: refused naming why, redone with -y
    code, _, err = caption(capsys, url, tiny_checkpoint, "-f", "srt", "-o", pattern, "--resume", "--run-log", record)
    assert (code, err.splitlines()[-1]) == (
        1,
        f"ffai: error: {track}: written with other settings (the input file changed); use -y to redo it, or another -o",
    )
    flags = ("-f", "srt", "-o", pattern, "--resume", "--run-log", record, "-y")
    code, _, err = caption(capsys, url, tiny_checkpoint, *flags)
    assert code == 0, err
    assert track.read_bytes() == first
