"""``--stop``: an answer ends where its text first holds a stop string, the string left out, as
transformers' ``StopStringCriteria`` stops (the same tokens), on every path: outputs, streaming,
windows decoded together, both families."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from PIL import Image

from engine_requests import request
from ffai.cli import run
from ffai.engines.contract import DecodingOptions, RuntimeOptions
from ffai.engines.qwen3vl.bench.checkpoints import WRITER as QWEN_WRITER
from ffai.engines.qwen3vl.bench.reference import reference_inputs
from ffai.engines.smolvlm import ENGINE
from ffai.errors import UsageError
from ffai.kit.stop_strings import StopFilter, cut
from ffai.run.inline import InlineEngine
from test_mux import subtitle_cues
from test_smolvlm_model import processor_inputs, random_image

ROOT = Path(__file__).resolve().parent.parent
DEMO_CLIP = ROOT / "examples" / "demo_clip.mp4"
DEMO_BEFORE_ON = ["a red circle", "a yellow star", "a white triangle", "a pink square"]
N_NEW = 24


def test_the_text_before_the_earliest_stop_string():
    assert cut("a red circle on a blue background", [" on", "blue"]) == "a red circle"
    assert cut("a red circle", [" on"]) == "a red circle"
    assert cut("x. y.", ["."]) == "x"


def test_streamed_pieces_never_show_what_a_stop_string_cuts():
    text = "a red circle on a blue background. Then more."
    for stops in ([" on"], ["."], ["background", "circle o"], ["zz"], []):
        for seed in range(20):
            rng = random.Random(seed)
            cuts = sorted(rng.sample(range(1, len(text)), 8))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
            shown: list[str] = []
            out = StopFilter(stops, shown.append)
            for piece in pieces:
                out(piece)
                assert all(stop not in "".join(shown) for stop in stops)
            out.finish()
            assert "".join(shown) == cut(text, stops), (stops, pieces)


def test_an_empty_stop_string_is_refused():
    with pytest.raises(UsageError, match="--stop must not be empty"):
        DecodingOptions(stop=("ok", ""))


def test_the_command_refuses_an_empty_stop_in_one_line_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "out.srt"
    code = run(["caption", "-i", str(DEMO_CLIP), "--stop", "", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == ["ffai: error: --stop must not be empty"], err
    assert not out.exists()


def _demo(capsys, tmp_path: Path, *args: str, out: str) -> Path:
    path = tmp_path / out
    code = run(
        ["caption", "-i", str(DEMO_CLIP), "--fps", "2", "--window", "6", "--stop", " on", *args, "-o", str(path)]
    )
    assert code == 0, capsys.readouterr().err
    return path


@pytest.mark.parametrize("batch", ["1", "4"])
def test_stop_on_cuts_every_demo_cue_in_every_output(capsys, tmp_path, batch):
    flags = ("-q", "--batch", batch)
    srt = _demo(capsys, tmp_path, *flags, out="demo.srt").read_text(encoding="utf-8")
    assert [block.splitlines()[2] for block in srt.strip().split("\n\n")] == DEMO_BEFORE_ON
    vtt = _demo(capsys, tmp_path, *flags, out="demo.vtt").read_text(encoding="utf-8")
    assert [block.splitlines()[1] for block in vtt.strip().split("\n\n")[1:]] == DEMO_BEFORE_ON
    doc = json.loads(_demo(capsys, tmp_path, *flags, out="demo.json").read_text(encoding="utf-8"))
    assert [cue["text"] for cue in doc["cues"]] == DEMO_BEFORE_ON
    _, cues, _ = subtitle_cues(_demo(capsys, tmp_path, *flags, out="demo.mkv"))
    assert [cue.content for cue in cues] == DEMO_BEFORE_ON


def test_partial_answers_never_show_text_past_a_stop(capsys):
    args = ["caption", "-i", str(DEMO_CLIP), "--fps", "2", "--window", "6", "--stop", " on"]
    code = run([*args, "--partial", "-f", "jsonl", "-o", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    partial = [e for e in events if e.get("partial")]
    assert partial and all(
        " on" not in e["text"] and DEMO_BEFORE_ON[e["index"] - 1].startswith(e["text"]) for e in partial
    )
    assert [e["text"] for e in events if not e.get("partial")] == DEMO_BEFORE_ON


def _spanning_stop(decode, tokens: list[int], at: int) -> str:
    """A stop string across the boundary of tokens ``at`` and ``at + 1`` of a reference answer."""
    left, right = decode(tokens[: at + 1]), decode(tokens[: at + 2])
    stop = left[-2:] + right[len(left) : len(left) + 2]
    assert len(stop) >= 2 and stop in right and stop not in left
    return stop


@pytest.fixture(scope="module")
def smolvlm_pair(one_torch_thread, tiny_checkpoint, reference_loader):
    ref, processor = reference_loader(tiny_checkpoint)
    return InlineEngine(ENGINE, tiny_checkpoint, RuntimeOptions()), ref, processor


@pytest.mark.oracle
@pytest.mark.parametrize("at", [2, 9])
def test_smolvlm_stops_where_stop_string_criteria_stops(smolvlm_pair, at):
    model, ref, processor = smolvlm_pair
    images = [random_image(900, (200, 150))]
    inputs = processor_inputs(processor, images, split=True)
    n = inputs["input_ids"].shape[1]
    with torch.no_grad():
        free = ref.generate(**inputs, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False)[0, n:].tolist()
    decode = processor.tokenizer.decode
    stop = _spanning_stop(decode, free, at)
    with torch.no_grad():
        theirs = ref.generate(
            **inputs, max_new_tokens=N_NEW, do_sample=False, stop_strings=[stop], tokenizer=processor.tokenizer
        )[0, n:].tolist()
    options = DecodingOptions(max_new_tokens=N_NEW, stop=(stop,))
    answer = model.through(request(images, options, still=True), "text")
    assert list(answer.token_ids) == theirs and len(theirs) < N_NEW
    assert answer.text == cut(decode(theirs, skip_special_tokens=True), [stop]) and stop not in answer.text


@pytest.mark.oracle
def test_qwen3vl_stops_where_stop_string_criteria_stops(capsys, tmp_path, qwen3vl_tiny):
    still = tmp_path / "still.png"
    Image.effect_mandelbrot((211, 137), (-2, -1.2, 1, 1.2), 60).convert("RGB").save(still)
    options = DecodingOptions(max_new_tokens=N_NEW)
    processor = QWEN_WRITER.reference_processor(qwen3vl_tiny)
    with Image.open(still) as image:
        inputs = reference_inputs(processor, qwen3vl_tiny, [image.convert("RGB")], None, None, options)
    reference, n = QWEN_WRITER.reference_model(qwen3vl_tiny), inputs["input_ids"].shape[1]
    with torch.inference_mode():
        free = reference.generate(**inputs, max_new_tokens=N_NEW, do_sample=False)[0, n:].tolist()
        stop = _spanning_stop(processor.tokenizer.decode, free, 0)  # its answer repeats one token
        theirs = reference.generate(
            **inputs, max_new_tokens=N_NEW, do_sample=False, stop_strings=[stop], tokenizer=processor.tokenizer
        )[0, n:].tolist()
    assert len(theirs) < N_NEW
    out = tmp_path / "still.json"
    args = ["caption", "--engine", "qwen3-vl", "--model", str(qwen3vl_tiny), "-i", str(still), "--stop", stop]
    assert run([*args, "--max-new-tokens", str(N_NEW), "-o", str(out)]) == 0, capsys.readouterr().err
    (cue,) = json.loads(out.read_text(encoding="utf-8"))["cues"]
    assert cue["text"] == cut(processor.decode(theirs, skip_special_tokens=True), [stop]).strip()
