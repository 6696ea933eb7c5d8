"""An output never replaces an input: ``-o`` naming a file the run reads (the same path, a
symbolic or hard link to it, a ``file://`` URL's file, a pattern landing on an input, another
input of the run), in any format, is refused in one line before anything is read, the input
byte for byte as it was; among several inputs the refused one fails alone. ``ffai sheet`` refuses
its track and its source alike."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ffai.cli import run
from media_fixtures import make_av_clip

FLAGS = ["--fps", "2", "--window", "2", "--max-new-tokens", "4", "-y"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def clip(tmp_path) -> Path:
    return make_av_clip(tmp_path / "a.mkv", 1, "libx264", "aac")


def refused(capsys, checkpoint: Path, *args: str) -> str:
    code = run(["caption", "--model", str(checkpoint), *FLAGS, *args])
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert len(err.splitlines()) == 1 and err.startswith("ffai: error:"), err
    assert "the output is the input" in err and "name another output" in err, err
    return err


@pytest.mark.parametrize("fmt", [None, "srt", "json", "mkv", "mp4"])
def test_the_same_path_in_any_format(capsys, tiny_checkpoint, clip, fmt):
    before = digest(clip)
    more = [] if fmt is None else ["-f", fmt]
    err = refused(capsys, tiny_checkpoint, "-i", str(clip), "-o", str(clip), *more)
    assert err == f"ffai: error: {clip}: the output is the input (ffmpeg refuses this too); name another output"
    assert digest(clip) == before and sorted(p.name for p in clip.parent.iterdir()) == ["a.mkv"]


def test_links_urls_and_patterns(capsys, tiny_checkpoint, clip, tmp_path):
    before = digest(clip)
    (tmp_path / "soft.mkv").symlink_to(clip)
    os.link(clip, tmp_path / "hard.mkv")
    routes = [
        ["-i", str(clip), "-o", str(tmp_path / "soft.mkv")],  # the output a link to the input
        ["-i", str(tmp_path / "soft.mkv"), "-o", str(clip)],  # the input a link to the output
        ["-i", str(clip), "-o", str(tmp_path / "hard.mkv"), "-f", "srt"],
        ["-i", clip.as_uri(), "-o", str(clip)],
        ["-i", str(clip), "-o", str(tmp_path / "{stem}.mkv")],
        ["-i", str(clip), "-o", str(tmp_path / "sub" / ".." / "a.mkv")],
    ]
    for args in routes:
        refused(capsys, tiny_checkpoint, *args)
        assert digest(clip) == before, args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.mkv", "hard.mkv", "soft.mkv"]


def test_among_several_inputs_the_refused_one_fails_alone(capsys, tiny_checkpoint, tmp_path):
    a = make_av_clip(tmp_path / "a.mkv", 1, "libx264", None)
    b = make_av_clip(tmp_path / "b.mp4", 1, "libx264", None)
    before = digest(a), digest(b)
    # {stem}.mkv: a's output is a itself; b's is b.mkv, a new file.
    code = run(
        [
            "caption",
            "--model",
            str(tiny_checkpoint),
            *FLAGS,
            "-i",
            str(a),
            "-i",
            str(b),
            "-o",
            str(tmp_path / "{stem}.mkv"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"ffai: error: {a}: the output is the input (ffmpeg refuses this too)" in err
    assert "1 done, 0 skipped, 1 failed" in err
    assert (digest(a), digest(b)) == before and (tmp_path / "b.mkv").stat().st_size > 0


def test_an_output_that_is_another_input(capsys, tiny_checkpoint, tmp_path):
    a = make_av_clip(tmp_path / "a.mkv.mp4", 1, "libx264", None)
    b = make_av_clip(tmp_path / "a.mkv", 1, "libx264", None)
    before = digest(b)
    # {stem} -f mkv: a.mkv.mp4's output is a.mkv, the run's other input; a.mkv's is a, a new file.
    args = ["-i", str(a), "-i", str(b), "-o", str(tmp_path / "{stem}"), "-f", "mkv"]
    code = run(["caption", "--model", str(tiny_checkpoint), *FLAGS, *args])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"ffai: error: {b}: the output of {a} is the input {b} (ffmpeg refuses this too)" in err, err
    assert "1 done, 0 skipped, 1 failed" in err
    assert digest(b) == before and (tmp_path / "a").stat().st_size > 0


def test_the_sheet_refuses_its_track_and_its_source(capsys, tiny_checkpoint, clip, tmp_path):
    track = tmp_path / "a.json"
    assert run(["caption", "--model", str(tiny_checkpoint), *FLAGS, "-i", str(clip), "-o", str(track)]) == 0
    capsys.readouterr()
    for output in (track, clip):
        before = digest(output)
        assert run(["sheet", str(track), "-o", str(output), "-y"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "the output is the input" in err, err
        assert digest(output) == before
