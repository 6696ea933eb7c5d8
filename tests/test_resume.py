"""``--resume``, retries and Ctrl-C over a corpus (issue #11): finished inputs skipped,
unfinished ones redone, failed ones retried, a changed option refused or redone with -y, a
worker killed mid-input retried, and an interrupted run resumed to the bytes of an
uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ffai.cli import run
from ffai.run import runlog
from sample_media import make_clip


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[Path]:
    """Two clips of one name in two folders of one corpus folder (``clips[0].parent.parent``).
    b is long (80 windows) so that the Ctrl-C test's signal, sent once b's first cue is on
    disk, arrives well before b's last one: with 24 windows the tiny model sometimes finished b
    between the check and the signal."""
    root = tmp_path_factory.mktemp("clips")
    return [
        make_clip(root / "a" / "clip.mp4", 2, fps=10, size=(64, 48)),
        make_clip(root / "b" / "clip.mp4", 20, fps=10, size=(64, 48)),
    ]


def flags(model: Path, clips: list[Path], *more: Path) -> list[str]:
    inputs = [arg for source in (clips[0].parent.parent, *more) for arg in ("-i", str(source))]
    return ["caption", *inputs, "--model", str(model), "--fps", "4", "--window", "1", "--max-new-tokens", "3"]


def caption(capsys, *args: str) -> tuple[int, list[str]]:
    code = run(list(args))
    return code, capsys.readouterr().err.splitlines()


def tracks(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("clip.json"))}


@pytest.fixture(scope="module")
def reference(clips, tiny_checkpoint, tmp_path_factory) -> dict[str, bytes]:
    """The tracks of one uninterrupted, fault-free run."""
    out = tmp_path_factory.mktemp("reference")
    assert run([*flags(tiny_checkpoint, clips), "-o", f"{out}/{{reldir}}/{{stem}}.json", "-q"]) == 0
    found = tracks(out)
    assert sorted(found) == ["a/clip.json", "b/clip.json"]
    return found


def records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_resume_skips_done_redoes_half_written_and_retries_failed(capsys, clips, tiny_checkpoint, reference, tmp_path):
    late = tmp_path / "late" / "late.mp4"  # missing at first: that input fails
    out = tmp_path / "out"
    args = [*flags(tiny_checkpoint, clips, late), "-o", f"{out}/{{reldir}}/{{stem}}.json"]
    code, err = caption(capsys, *args)
    assert code == 1
    assert err[-2:] == ["ffai: 2 done, 0 skipped, 1 failed", f"ffai: failed: {late}: no such file"]
    first = tracks(out)
    assert first == reference

    # A run killed while writing b: its track holds the first cue only (a valid document, as the
    # driver publishes it) and the record's last word on it is "running".
    b_track = out / "b" / "clip.json"
    document = json.loads(b_track.read_text())
    document["cues"] = document["cues"][:1]
    b_track.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
    log = out / runlog.DEFAULT_NAME
    run_line = next(e for e in records(log) if e["kind"] == "run")
    with runlog.RunLog(str(log), run_line["settings"]) as writer:
        writer.input(str(clips[1]), str(b_track), "running", attempts=1)
    shutil.copy(clips[0], late.parent.mkdir() or late)
    a_mtime = (out / "a" / "clip.json").stat().st_mtime_ns

    code, err = caption(capsys, *args, "--resume")
    assert code == 0, err
    assert err == ["ffai: 2 done, 1 skipped, 0 failed"]
    assert (out / "a" / "clip.json").stat().st_mtime_ns == a_mtime  # skipped, untouched
    assert b_track.read_bytes() == reference["b/clip.json"]  # redone from scratch
    assert json.loads((out / "late.json").read_text())["cues"]  # retried
    last = {e["input"]: e["status"] for e in records(log) if e["kind"] == "input"}
    assert last == {str(clips[0]): "skipped", str(clips[1]): "done", str(late): "done"}


def test_changed_option_is_refused_naming_it_and_redone_with_y(capsys, clips, tiny_checkpoint, reference, tmp_path):
    out = tmp_path / "out"
    args = [*flags(tiny_checkpoint, clips), "-o", f"{out}/{{reldir}}/{{stem}}.json", "--resume"]
    assert caption(capsys, *args)[0] == 0
    code, err = caption(capsys, *args, "--prompt", "What colour is it?")
    assert code == 1
    assert err == [
        f"ffai: error: {out}/a/clip.json: written with other settings (--prompt changed); use -y to redo it, or another -o"
    ]
    assert tracks(out) == reference
    code, err = caption(capsys, *args, "--prompt", "What colour is it?", "-y")
    assert code == 0, err
    assert err == ["ffai: 2 done, 0 skipped, 0 failed"]
    for track in tracks(out).values():
        assert json.loads(track)["params"]["prompt"] == "What colour is it?"


def _children(pid: int) -> set[int]:
    kids = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return kids


def _pipeline_workers() -> set[int]:
    """This process's pipeline workers: spawned children that are not media decoders."""
    found = set()
    for pid in _children(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline and b"ffai.media" not in cmdline:
            found.add(pid)
    return found


def test_a_worker_killed_mid_input_is_retried_on_a_fresh_pipeline(capsys, clips, tiny_checkpoint, reference, tmp_path):
    out = tmp_path / "out"
    before = _pipeline_workers()
    killed: list[int] = []

    def kill_the_worker_once_a_cue_is_written() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            workers = _pipeline_workers() - before
            if workers and any(out.rglob("clip.json")):
                pid = workers.pop()
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_the_worker_once_a_cue_is_written)
    killer.start()
    code, err = caption(
        capsys, *flags(tiny_checkpoint, clips), "--placement", "workers", "-o", f"{out}/{{reldir}}/{{stem}}.json"
    )
    killer.join()
    assert killed, "no worker to kill"
    assert code == 0, err
    retried = [line for line in err if "trying again" in line]
    assert len(retried) == 1 and f"(pid {killed[0]}) died" in retried[0], err
    assert retried[0].endswith("trying again (1 of 3 attempts made)")
    assert err[-1] == "ffai: 2 done, 0 skipped, 0 failed"
    assert tracks(out) == reference
    entries = [e for e in records(out / runlog.DEFAULT_NAME) if e["kind"] == "input"]
    hit = next(e for e in entries if e["status"] == "failed")
    assert (hit["transient"], hit["retry"], hit["attempts"]) == (True, True, 1)
    assert [e["attempts"] for e in entries if e["input"] == hit["input"] and e["status"] == "done"] == [2]
    assert not _pipeline_workers() - before  # the restarted pipeline stopped too


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background child inherits SIGINT ignored


def test_ctrl_c_then_resume_gives_the_bytes_of_an_uninterrupted_run(
    capsys, clips, tiny_checkpoint, reference, tmp_path
):
    out = tmp_path / "out"
    args = [*flags(tiny_checkpoint, clips), "-o", f"{out}/{{reldir}}/{{stem}}.json"]
    log = out / runlog.DEFAULT_NAME
    proc = subprocess.Popen(
        [sys.executable, "-m", "ffai", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )

    def b_is_half_written() -> bool:
        if not (out / "b" / "clip.json").exists():
            return False
        done = {e["input"] for e in records(log) if e.get("status") == "done"}
        return done == {str(clips[0])}

    deadline = time.monotonic() + 60
    while not b_is_half_written():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert (out / "a" / "clip.json").read_bytes() == reference["a/clip.json"]
    partial = json.loads((out / "b" / "clip.json").read_text())  # valid, and short of the whole
    assert 0 < len(partial["cues"]) < len(json.loads(reference["b/clip.json"])["cues"])
    last = [e for e in records(log) if e["kind"] == "input"][-1]
    assert (last["input"], last["status"], last["cues"]) == (str(clips[1]), "interrupted", len(partial["cues"]))

    code, err = caption(capsys, *args, "--resume")
    assert code == 0, err
    assert err == ["ffai: 1 done, 1 skipped, 0 failed"]
    assert tracks(out) == reference
