"""What ffai offers beside the caption itself, on the qwen3-vl engine's tiny checkpoint: worker
placement, a live pipe with the answer streamed piece by piece, the html contact sheet, and the
bad checkpoints and mismatched models refused in one line before weights load. (Its Ray actors
are in tests/test_ray.py, on that module's local Ray.)

The answers themselves are gated against transformers in tests/test_qwen3vl_engine.py; here the
reference is ffai's own inline run of the same input read as a file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ffai.bench import demo_scenes
from ffai.cli import run
from ffai.engines.contract import DecodingOptions
from ffai.run.captioner import Captioner
from ffai.run.options import CaptionOptions
from live_sources import start_caption
from live_stream import encode_ts
from sheet_reader import read

TOKENS = 6
SAMPLING = ["--fps", "2", "--window", "2", "--max-new-tokens", str(TOKENS)]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """Two of the demo scenes, 1 s each, as MPEG-TS: a file here, a pipe's bytes below."""
    path = tmp_path_factory.mktemp("qwen-media") / "clip.ts"
    path.write_bytes(encode_ts(demo_scenes.CLIP_SCENES[:2], 1.0))
    return path


@pytest.fixture(scope="module")
def inline_cues(qwen3vl_tiny, clip) -> list:
    """The clip read as a file by stages in this process: what every other way of running it
    must give."""
    decoding = DecodingOptions(max_new_tokens=TOKENS)
    with Captioner(
        CaptionOptions(model=str(qwen3vl_tiny), fps=2, window=2, decoding=decoding, placement="inline")
    ) as captioner:
        cues = list(captioner.captions(captioner.decoder.probe(clip)))
    assert [(c.start_ms, c.end_ms) for c in cues] == [(0, 1000), (1000, 2000)]
    assert all(c.text and len(c.token_ids) <= TOKENS for c in cues)
    return cues


def test_a_live_pipe_into_worker_processes_streams_each_answer_and_gives_the_files_cues(
    qwen3vl_tiny, clip, inline_cues
):
    """The clip's bytes through standard input (a live source), the stages in a spawned worker
    process, --partial: each cue's pieces come before it, each its text so far, and the cues
    are those of the clip read as a file inline."""
    args = ["--engine", "qwen3-vl", "--model", str(qwen3vl_tiny), "-i", "-", *SAMPLING, "--placement", "workers"]
    live = start_caption(*args, "-f", "jsonl", "-o", "-", "--partial", stdin=subprocess.PIPE)
    live.process.stdin.buffer.write(clip.read_bytes())
    live.process.stdin.close()
    assert live.wait(timeout=180) == 0, live.stderr  # generous: a loaded 2-core machine
    records, cues = live.records(), live.cues()
    got = [(round(c["start"] * 1000), round(c["end"] * 1000), c["text"]) for c in cues]
    assert got == [(c.start_ms, c.end_ms, c.text) for c in inline_cues]
    for cue in cues:
        at = records.index(cue)
        so_far = [r["text"] for r in records[:at] if r.get("partial") and r["index"] == cue["index"]]
        assert len(so_far) > 1 and so_far[-1] == cue["text"]
        assert all(b.startswith(a) for a, b in zip(so_far, so_far[1:]))  # each grows the last


def test_the_html_sheet_shows_each_cue_with_its_frames(capsys, tmp_path, qwen3vl_tiny, clip, inline_cues, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    out = tmp_path / "clip.html"
    code = run(
        ["caption", "--engine", "qwen3-vl", "--model", str(qwen3vl_tiny), "-i", str(clip), *SAMPLING, "-o", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    page = read(out.read_text(encoding="utf-8"))
    expected = [(c.start_ms, c.end_ms, c.text) for c in inline_cues]
    assert [(c.start_ms, c.end_ms, c.text) for c in page.cards] == expected
    assert all(len(card.jpegs()) == 2 for card in page.cards)  # the window's two frames


# --- bad input: one line naming the file, before weights load ---------------------------------


def two_shards(tmp_path: Path, qwen3vl_tiny: Path, *, index: bool = True, edit=None) -> Path:
    """The tiny checkpoint as two shards (the vision tower's tensors in the second) and, with
    ``index``, their index; ``config.json`` edited by ``edit``."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    folder.mkdir()
    for path in qwen3vl_tiny.iterdir():
        if path.name != "model.safetensors":
            shutil.copy(path, folder / path.name)
    tensors = load_file(str(qwen3vl_tiny / "model.safetensors"))
    shards = {f"model-0000{i}-of-00002.safetensors": {} for i in (1, 2)}
    for name, tensor in tensors.items():
        shards[list(shards)[name.startswith("model.visual.")]][name] = tensor
    for shard, part in shards.items():
        save_file(part, str(folder / shard), metadata={"format": "pt"})
    if index:
        weight_map = {name: shard for shard, part in shards.items() for name in part}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if edit is not None:
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def narrower_text_mlp(config: dict) -> None:
    config["text_config"]["intermediate_size"] = 96  # the shards hold 128


@pytest.mark.parametrize(
    "case, fragments",
    [
        (
            "shards disagree with config",
            ["model-00001-of-00002.safetensors: tensor model.language_model.layers.", "has shape", "96"],
        ),
        ("shards without their index", ["no model.safetensors and no model.safetensors.index.json"]),
        ("smolvlm model on qwen3-vl", ["smolvlm-demo.toml: ", "--engine smolvlm"]),
        ("qwen model on smolvlm", ["qwen3-vl-2b-instruct.toml: ", "--engine qwen3-vl"]),
    ],
)
def test_a_bad_checkpoint_or_model_is_one_line_before_weights_load(
    capsys, tmp_path, qwen3vl_tiny, clip, case, fragments
):
    engine, model = "qwen3-vl", None
    if case == "shards disagree with config":
        model = str(two_shards(tmp_path, qwen3vl_tiny, edit=narrower_text_mlp))
    elif case == "shards without their index":
        model = str(two_shards(tmp_path, qwen3vl_tiny, index=False))
    elif case == "smolvlm model on qwen3-vl":
        model = "smolvlm-demo"
    else:
        engine, model = "smolvlm", "qwen3-vl-2b-instruct"
    out = tmp_path / "clip.srt"
    code = run(["caption", "--engine", engine, "--model", model, "-i", str(clip), *SAMPLING, "-o", str(out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("ffai: error: "), err
    assert all(f in lines[0] for f in fragments), err
    assert not out.exists()
