"""``ffai caption`` end to end on a tiny real checkpoint: tracks, streaming, several inputs,
and every kind of bad input (one line on stderr, non-zero exit, no file created or changed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import srt
from PIL import Image

from ffai.cli import run
from sample_media import make_audio_only, make_clip, make_truncated_mp4, make_zero_frame_clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("media") / "clip.mp4"
    make_clip(path, 6, fps=25, size=(96, 64))
    return path


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("media") / "red.png"
    Image.new("RGB", (120, 80), (220, 20, 20)).save(path)
    return path


def caption(capsys, *args: str) -> tuple[int, str, str]:
    code = run(["caption", *args])
    out, err = capsys.readouterr()
    return code, out, err


def caption_with(capsys, source: Path, model: Path, flags: str = "", *more: object) -> tuple[int, str, str]:
    """``ffai caption -i SOURCE --model MODEL FLAGS MORE...``; FLAGS is split on spaces."""
    return caption(capsys, "-i", str(source), "--model", str(model), *flags.split(), *map(str, more))


def one_error_line(err: str, fragment: str = "") -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ffai: error:"), err
    assert "Traceback" not in err
    assert fragment in lines[0], err
    return lines[0]


def test_still_prints_one_caption(capsys, image, tiny_checkpoint):
    code, out, err = caption(capsys, "-i", str(image), "--model", str(tiny_checkpoint), "--max-new-tokens", "6")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].strip()
    assert not lines[0].startswith("[")


def test_video_to_srt_tiles_the_timeline(capsys, clip, tiny_checkpoint, tmp_path):
    out = tmp_path / "clip.srt"
    code, _, err = caption_with(capsys, clip, tiny_checkpoint, "--fps 2 --window 4 --max-new-tokens 4 -o", out)
    assert code == 0, err
    cues = list(srt.parse(out.read_text(encoding="utf-8")))
    assert [c.start.total_seconds() for c in cues] == [0.0, 2.0, 4.0]
    assert [c.end.total_seconds() for c in cues] == [2.0, 4.0, 6.0]
    assert all(c.content.strip() for c in cues)


def test_jsonl_streams_to_stdout(capsys, clip, tiny_checkpoint):
    code, out, err = caption_with(capsys, clip, tiny_checkpoint, "--fps 1 --window 2 --max-new-tokens 3 -o - -f jsonl")
    assert code == 0, err
    cues = [json.loads(line) for line in out.splitlines()]
    assert [c["index"] for c in cues] == [1, 2, 3]
    assert [c["frame_times"] for c in cues] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


def test_json_document_and_segment(capsys, clip, tiny_checkpoint, tmp_path):
    out = tmp_path / "seg.json"
    code, _, err = caption_with(
        capsys, clip, tiny_checkpoint, "--fps 1 --window 2 -ss 2 -t 3 --max-new-tokens 3 -o", out
    )
    assert code == 0, err
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["version"] == 1
    assert doc["engine"] == {"name": "smolvlm", "model": str(tiny_checkpoint)}
    assert doc["params"]["fps"] == 1.0 and doc["params"]["window"] == 2
    times = [t for c in doc["cues"] for t in c["frame_times"]]
    assert times == [2.0, 3.0, 4.0]
    assert doc["cues"][-1]["end"] == 5.0


def test_existing_output_is_refused_then_overwritten_with_y(capsys, clip, tiny_checkpoint, tmp_path):
    out = tmp_path / "clip.txt"
    out.write_text("keep me\n")
    args = [
        "-i",
        str(clip),
        "--model",
        str(tiny_checkpoint),
        "--max-frames",
        "2",
        "--window",
        "2",
        "--max-new-tokens",
        "2",
        "-o",
        str(out),
    ]
    code, _, err = caption(capsys, *args)
    assert code == 1
    one_error_line(err, "already exists")
    assert out.read_text() == "keep me\n"
    code, _, err = caption(capsys, *args, "-y")
    assert code == 0, err
    assert out.read_text().startswith("[00:00:00.000 --> ")


def test_zero_frame_clip_gives_empty_track_and_warning(capsys, tiny_checkpoint, tmp_path):
    src = make_zero_frame_clip(tmp_path / "empty.mkv")
    out = tmp_path / "empty.srt"
    code, _, err = caption(capsys, "-i", str(src), "--model", str(tiny_checkpoint), "-o", str(out))
    assert code == 0, err
    assert out.read_text() == ""
    assert "ffai: warning:" in err and "no frames" in err


def test_window_too_large_for_context_is_refused_before_decoding(capsys, clip, tiny_checkpoint, tmp_path):
    out = tmp_path / "x.srt"
    code, _, err = caption(capsys, "-i", str(clip), "--model", str(tiny_checkpoint), "--window", "1000", "-o", str(out))
    assert code == 2
    one_error_line(err, "--window 1000")
    assert not out.exists()


def test_several_inputs_continue_past_a_failure(capsys, clip, image, tiny_checkpoint, tmp_path):
    missing = tmp_path / "missing.mp4"
    pattern = str(tmp_path / "{stem}.json")
    code, _, err = caption(
        capsys,
        "-i",
        str(missing),
        "-i",
        str(clip),
        "-i",
        str(image),
        "--model",
        str(tiny_checkpoint),
        *"--max-frames 2 --window 2 --max-new-tokens 2 -o".split(),
        pattern,
    )
    assert code == 1
    # The failure as it happens, then the run's summary repeating it (issue #11).
    reason = f"{missing}: no such file"
    assert err.splitlines() == [
        f"ffai: error: {reason}",
        "ffai: 2 done, 0 skipped, 1 failed",
        f"ffai: failed: {reason}",
    ]
    assert json.loads((tmp_path / "clip.json").read_text())["cues"]
    assert len(json.loads((tmp_path / "red.json").read_text())["cues"]) == 1
    assert not (tmp_path / "missing.json").exists()


def test_several_inputs_need_a_pattern(capsys, clip, image, tiny_checkpoint, tmp_path):
    code, _, err = caption(
        capsys, "-i", str(clip), "-i", str(image), "--model", str(tiny_checkpoint), "-o", str(tmp_path / "a.srt")
    )
    assert code == 2
    one_error_line(err, "{stem}")


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    empty = tmp / "empty.mp4"
    empty.write_bytes(b"")
    text = tmp / "text.mp4"
    text.write_text("this is not a video\n")
    folder = tmp / "folder"
    folder.mkdir()
    return {
        "missing": tmp / "nope.mp4",
        "directory": folder,
        "empty": empty,
        "text": text,
        "truncated": make_truncated_mp4(tmp / "trunc.mp4"),
        "audio-only": make_audio_only(tmp / "audio.m4a"),
    }


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "text", "truncated", "audio-only"])
def test_bad_input_is_one_line_and_creates_nothing(kind, tmp_path, tiny_checkpoint):
    bad = _bad_inputs(tmp_path)[kind]
    out = tmp_path / "out.srt"
    proc = subprocess.run(
        [sys.executable, "-m", "ffai", "caption", "-i", str(bad), "--model", str(tiny_checkpoint), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    one_error_line(proc.stderr, str(bad))
    assert not out.exists()


def test_unwritable_output_dir_is_refused_first(capsys, clip, tiny_checkpoint, tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "x.srt"
    code, _, err = caption(capsys, "-i", str(clip), "--model", str(tiny_checkpoint), "-o", str(out))
    assert code == 1
    one_error_line(err, str(out.parent))
    assert not out.parent.exists()


def test_runtime_never_imports_transformers(tmp_path, image, tiny_checkpoint):
    code = (
        "import sys\n"
        "sys.modules['transformers'] = None  # any import of it now raises ImportError\n"
        "from ffai.cli import run\n"
        f"sys.exit(run(['caption', '-i', {str(image)!r}, '--model', {str(tiny_checkpoint)!r}, '--max-new-tokens', '3']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def _broken_checkpoint(src: Path, dst: Path, kind: str) -> tuple[Path, str]:
    """A copy of a good checkpoint with one thing wrong; returns it and the file to be named."""
    shutil.copytree(src, dst)
    if kind == "no-config":
        (dst / "config.json").unlink()
        return dst, "config.json"
    if kind == "other-architecture":
        config = json.loads((dst / "config.json").read_text())
        config["model_type"] = "llava"
        (dst / "config.json").write_text(json.dumps(config))
        return dst, "config.json"
    if kind == "truncated-weights":
        weights = dst / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return dst, "model.safetensors"
    if kind == "tokenizer-without-image-tokens":
        tok = json.loads((dst / "tokenizer.json").read_text())
        tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<image>"]
        (dst / "tokenizer.json").write_text(json.dumps(tok))
        return dst, "tokenizer.json"
    raise ValueError(kind)


@pytest.mark.parametrize(
    "kind", ["no-config", "other-architecture", "truncated-weights", "tokenizer-without-image-tokens"]
)
def test_broken_checkpoint_is_one_line_naming_the_file(kind, capsys, image, tiny_checkpoint, tmp_path):
    model, culprit = _broken_checkpoint(tiny_checkpoint, tmp_path / "model", kind)
    code, out, err = caption(capsys, "-i", str(image), "--model", str(model), "--max-new-tokens", "2")
    assert code == 1, err
    one_error_line(err, culprit)
    assert out == ""


@pytest.mark.parametrize("size", [(16385, 8), (8, 20000)])
def test_oversized_image_is_refused_before_allocating(size, capsys, tiny_checkpoint, tmp_path):
    path = tmp_path / "huge.png"
    Image.new("1", size).save(path)  # 1-bit: tiny on disk and in memory
    code, _, err = caption(capsys, "-i", str(path), "--model", str(tiny_checkpoint))
    assert code == 1
    one_error_line(err, "16384")


def test_a_reader_that_leaves_early_ends_the_run_quietly(clip, tiny_checkpoint):
    """`ffai caption ... -o - | head -1`: the closed pipe stops the run with no error line and no
    traceback, as a Unix filter stops."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ffai", "caption", "-i", str(clip), "--model", str(tiny_checkpoint)]
        + ["--fps", "4", "--window", "1", "--max-new-tokens", "2", "-f", "jsonl", "-o", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) != 0
    assert json.loads(first)["index"] == 1
    assert "error" not in err and "Traceback" not in err, err
