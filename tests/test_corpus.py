"""Captioning a corpus on one machine (issue #11): what ``-i`` expands to, output patterns that
mirror the input tree, the run record, and a bad input failing alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ffai.cli import run
from ffai.errors import UsageError
from ffai.run import inputs
from sample_media import make_clip

FAST = ["--fps", "2", "--window", "2", "--max-new-tokens", "3"]


def touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def sources(specs: list[str]) -> list[str]:
    return [item.source for item in inputs.expand(specs)]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "archive"
    for name in ["b/2.mp4", "b/10.mp4", "a.mp4", "c/d/e.mov", "notes.md", "a.srt", ".hidden.mp4", ".cache/x.mp4"]:
        touch(root / name)
    return root


def test_folder_is_every_visible_file_below_it_sorted_but_tracks(tree):
    # Sorted by path components (not by string: "b/2.mp4" < "b10"), so a folder's files stay together.
    touch(tree / "b10")
    expected = ["a.mp4", "b/10.mp4", "b/2.mp4", "b10", "c/d/e.mov", "notes.md"]
    assert sources([str(tree)]) == [str(tree / p) for p in expected]


def test_glob_recurses_with_double_star_sorted_and_roots_at_its_fixed_part(tree, monkeypatch):
    monkeypatch.chdir(tree.parent)
    found = inputs.expand(["archive/**/*.mp4"])
    assert [i.source for i in found] == ["archive/a.mp4", "archive/b/10.mp4", "archive/b/2.mp4"]
    assert {i.root for i in found} == {"archive"}
    assert [inputs.reldir(i) for i in found] == [".", "b", "b"]
    assert sources(["archive/[c]"]) == ["archive/c/d/e.mov"]  # a folder a glob matches is a folder


def test_glob_matching_nothing_is_an_error(tree):
    with pytest.raises(UsageError, match=r"no file matches .*\*\.mkv"):
        inputs.expand([str(tree / "**" / "*.mkv")])


def test_existing_path_with_glob_characters_is_taken_literally(tmp_path):
    odd = touch(tmp_path / "take [1].mp4")
    assert sources([str(odd)]) == [str(odd)]


def test_missing_plain_file_passes_through_for_its_probe_to_report(tmp_path):
    assert sources([str(tmp_path / "nope.mp4")]) == [str(tmp_path / "nope.mp4")]


def test_list_file_skips_comments_and_blanks_and_reads_paths_beside_it(tree, tmp_path, monkeypatch):
    listing = tmp_path / "lists" / "clips.txt"
    touch(listing, f"# my clips\n\n../archive/a.mp4\n  ../archive/c  \n{tree / 'b' / '2.mp4'}\n# end\n".encode())
    monkeypatch.chdir(tree / "b")  # relative lines are relative to the list, not the working folder
    found = inputs.expand(["@" + str(listing)])
    assert [os.path.abspath(i.source) for i in found] == [str(tree / p) for p in ["a.mp4", "c/d/e.mov", "b/2.mp4"]]
    assert [inputs.reldir(i) for i in found] == [".", "c/d", "b"]  # under the deepest common folder


def test_empty_list_and_empty_folder_are_errors(tmp_path):
    listing = touch(tmp_path / "l.txt", b"# nothing\n\n")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="names no input"):
        inputs.expand(["@" + str(listing)])
    with pytest.raises(UsageError, match="no file to caption"):
        inputs.expand([str(tmp_path / "empty")])


def test_stdin_and_urls_pass_through_and_a_file_named_twice_counts_once(tree):
    specs = ["-", "rtsp://cam/1", str(tree / "a.mp4"), str(tree / "*.mp4"), str(tree)]
    assert sources(specs)[:4] == ["-", "rtsp://cam/1", str(tree / "a.mp4"), str(tree / "b/10.mp4")]
    assert sources(specs).count(str(tree / "a.mp4")) == 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two clips of one name in different folders, a still, and a file that is no media."""
    root = tmp_path_factory.mktemp("corpus")
    make_clip(root / "a" / "clip.mp4", 2, fps=10, size=(64, 48))
    make_clip(root / "b" / "clip.mp4", 3, fps=10, size=(64, 48))
    from PIL import Image

    Image.new("RGB", (40, 30), (10, 200, 10)).save(root / "b" / "green.png")
    touch(root / "readme.md", b"not media\n")
    return root


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_same_names_collide_without_reldir_and_are_refused_before_any_work(
    capsys, corpus, tiny_checkpoint, tmp_path
):
    out = tmp_path / "out"
    out.mkdir()
    code = run(["caption", "-i", str(corpus), "--model", str(tiny_checkpoint), "-o", f"{out}/{{stem}}.srt"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        f"ffai: error: {corpus}/a/clip.mp4 and {corpus}/b/clip.mp4 would both write {out}/clip.srt; "
        "use {reldir}, {name} or {parent} in the -o pattern"
    ]
    assert list(out.iterdir()) == []


def test_corpus_mirrors_the_tree_records_every_input_and_a_bad_one_fails_alone(
    capsys, corpus, tiny_checkpoint, tmp_path
):
    out = tmp_path / "out"
    code = run(
        ["caption", "-i", str(corpus), "--model", str(tiny_checkpoint), *FAST, "-o", f"{out}/{{reldir}}/{{stem}}.json"]
    )
    err = capsys.readouterr().err.splitlines()
    bad = f"{corpus}/readme.md: not a readable image or video (Invalid data found when processing input)"
    assert code == 1
    assert err == [f"ffai: error: {bad}", "ffai: 3 done, 0 skipped, 1 failed", f"ffai: failed: {bad}"]
    tracks = {p.relative_to(out).as_posix(): json.loads(p.read_text()) for p in out.rglob("*.json")}
    assert sorted(tracks) == ["a/clip.json", "b/clip.json", "b/green.json"]
    assert len(tracks["a/clip.json"]["cues"]) == 2 and len(tracks["b/clip.json"]["cues"]) == 3
    assert tracks["b/clip.json"]["source"]["path"] == f"{corpus}/b/clip.mp4"
    assert not (out / "readme.json").exists()

    record = lines_of(out / "ffai-run.jsonl")
    head, entries = record[0], record[1:]
    assert head["kind"] == "run" and len(head["fingerprint"]) == 16
    settings = head["settings"]
    assert (settings["engine"], settings["model"], settings["format"]) == ("smolvlm", str(tiny_checkpoint), "json")
    assert (settings["fps"], settings["window"], settings["max_new_tokens"], settings["prompt"]) == (2.0, 2, 3, None)
    assert len(settings["model_files"]) == 64
    last = {e["input"]: e for e in entries}
    assert [e["status"] for e in entries if e["input"].endswith("a/clip.mp4")] == ["running", "done"]
    clip = last[f"{corpus}/a/clip.mp4"]
    stat = os.stat(corpus / "a" / "clip.mp4")
    assert clip["output"] == f"{out}/a/clip.json" and clip["fingerprint"] == head["fingerprint"]
    assert (clip["size"], clip["mtime"], clip["attempts"], clip["cues"]) == (stat.st_size, stat.st_mtime, 1, 2)
    assert clip["seconds"] > 0
    failed = last[f"{corpus}/readme.md"]
    assert (failed["status"], failed["error"], failed["transient"], failed["attempts"]) == ("failed", bad, False, 1)


def test_run_log_flag_puts_the_record_where_asked_also_for_one_input(capsys, corpus, tiny_checkpoint, tmp_path):
    log = tmp_path / "logs" / "run.jsonl"
    log.parent.mkdir()
    still = corpus / "b" / "green.png"
    code = run(
        [
            "caption",
            "-i",
            str(still),
            "--model",
            str(tiny_checkpoint),
            *FAST,
            "-o",
            str(tmp_path / "g.txt"),
            "--run-log",
            str(log),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert [(e["kind"], e.get("status")) for e in lines_of(log)] == [
        ("run", None),
        ("input", "running"),
        ("input", "done"),
    ]
    assert not (tmp_path / "ffai-run.jsonl").exists()


def test_parent_of_a_bare_file_name_is_the_working_folder(tmp_path, monkeypatch):
    from ffai.run.jobs import plan_jobs

    monkeypatch.chdir(tmp_path)
    found = inputs.expand(["clip.mp4", "sub/clip.mp4"])
    jobs = plan_jobs(found, "{parent}/{stem}.srt", None)
    assert [j.output for j in jobs] == ["clip.srt", "sub/clip.srt"]
    assert [j.output for j in plan_jobs(found, "out/{reldir}/{name}.vtt", None)] == [
        "out/clip.mp4.vtt",
        "out/sub/clip.mp4.vtt",
    ]


def test_events_for_stdout_come_one_input_after_another_in_job_order():
    from ffai.run.input_events import InputEvent
    from ffai.run.jobs import _in_job_order

    # A backend running inputs 0, 1 and 2 side by side (as on Ray), 2 failing before it starts.
    arrived = [(1, "start"), (0, "start"), (1, "cue"), (2, "failed"), (0, "cue"), (1, "done"), (0, "done")]
    events = [InputEvent(job, kind) for job, kind in arrived]
    ordered = [(e.job, e.kind) for e in _in_job_order(events, [0, 1, 2])]
    assert ordered == [(0, "start"), (0, "cue"), (0, "done"), (1, "start"), (1, "cue"), (1, "done"), (2, "failed")]
