"""``--repetition-penalty``: transformers' ``RepetitionPenaltyLogitsProcessor`` in the kit's one
token loop, so both families (and windows decoded together) give the tokens transformers'
``generate(repetition_penalty=F)`` gives on the same checkpoint and input, greedy float32."""

from __future__ import annotations

import json
import math
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
from ffai.kit.token_sampling import penalizer
from ffai.run.inline import InlineEngine
from test_smolvlm_model import processor_inputs, random_image, reference_generate

ROOT = Path(__file__).resolve().parent.parent
DEMO_CLIP = ROOT / "examples" / "demo_clip.mp4"
N_NEW = 24
PENALTIES = (1.1, 1.3)


def test_the_penalty_is_transformers_logits_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(1, 50) * 4
    prompt, answer = torch.tensor([3, 7, 7, 11, 40]), [11, 2, 49]
    for penalty in (0.7, 1.1, 1.3, 2.0):
        penalize = penalizer(DecodingOptions(repetition_penalty=penalty), prompt)
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(
            torch.cat([prompt, torch.tensor(answer)])[None], logits.clone()
        )
        assert torch.equal(penalize(logits, answer), theirs)
    assert penalizer(DecodingOptions(), prompt) is None  # 1.0: off, nothing runs


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_a_penalty_that_is_not_a_finite_positive_number_is_refused(value):
    with pytest.raises(UsageError, match="--repetition-penalty must be a finite number > 0"):
        DecodingOptions(repetition_penalty=value)


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_the_command_refuses_a_bad_penalty_in_one_line_and_writes_nothing(capsys, tmp_path, value):
    out = tmp_path / "out.srt"
    code = run(["caption", "-i", str(DEMO_CLIP), "--repetition-penalty", value, "-o", str(out)])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--repetition-penalty" in lines[0] and "Traceback" not in err, err
    assert not out.exists()


@pytest.fixture(scope="module")
def smolvlm_pair(one_torch_thread, tiny_checkpoint, reference_loader):
    ref, processor = reference_loader(tiny_checkpoint)
    return InlineEngine(ENGINE, tiny_checkpoint, RuntimeOptions()), ref, processor


@pytest.mark.oracle
@pytest.mark.parametrize("penalty", PENALTIES)
@pytest.mark.parametrize("split", [True, False], ids=["still", "frame"])
def test_smolvlm_tokens_equal_transformers_with_the_penalty(smolvlm_pair, penalty, split):
    model, ref, processor = smolvlm_pair
    changed = False
    for seed, size in enumerate([(200, 150), (90, 160)]):
        images = [random_image(800 + seed, size)]
        options = DecodingOptions(max_new_tokens=N_NEW, force_new_tokens=True, repetition_penalty=penalty)
        ours = model["text"].generate_ids(model.through(request(images, options, still=split), "vision"))
        inputs = processor_inputs(processor, images, split=split)
        theirs, _ = reference_generate(ref, inputs, n=N_NEW, repetition_penalty=penalty)
        assert ours == theirs, size
        changed |= theirs != reference_generate(ref, inputs, n=N_NEW)[0]
    assert changed  # the penalty moved the tokens, so the comparison above saw it at work


@pytest.mark.oracle
# The tiny checkpoint's random weights favour one token by a margin 1.1 and 1.3 do not move;
# a large penalty shows the comparison with the penalty at work.
@pytest.mark.parametrize("penalty", [*PENALTIES, 50.0])
def test_qwen3vl_tokens_equal_transformers_with_the_penalty(capsys, tmp_path, qwen3vl_tiny, penalty):
    still = tmp_path / "still.png"
    Image.effect_mandelbrot((211, 137), (-2, -1.2, 1, 1.2), 60).convert("RGB").save(still)
    out = tmp_path / "still.json"
    args = ["caption", "--engine", "qwen3-vl", "--model", str(qwen3vl_tiny), "-i", str(still)]
    code = run([*args, "--max-new-tokens", str(N_NEW), "--repetition-penalty", str(penalty), "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    options = DecodingOptions(max_new_tokens=N_NEW, repetition_penalty=penalty)
    processor = QWEN_WRITER.reference_processor(qwen3vl_tiny)
    with Image.open(still) as image:
        inputs = reference_inputs(processor, qwen3vl_tiny, [image.convert("RGB")], None, None, options)
    reference = QWEN_WRITER.reference_model(qwen3vl_tiny)
    with torch.inference_mode():
        penalised = reference.generate(**inputs, max_new_tokens=N_NEW, do_sample=False, repetition_penalty=penalty)
        plain = reference.generate(**inputs, max_new_tokens=N_NEW, do_sample=False)
    n = inputs["input_ids"].shape[1]
    expected = processor.decode(penalised[0, n:], skip_special_tokens=True).strip()
    (cue,) = json.loads(out.read_text(encoding="utf-8"))["cues"]
    assert cue["text"] == expected and expected
    if penalty == 50.0:
        assert penalised[0, n:].tolist() != plain[0, n:].tolist()  # the penalty was at work


@pytest.mark.oracle
def test_windows_decoded_together_are_penalised_row_by_row(capsys, tmp_path, tiny_checkpoint):
    """float32 rows of a batch are their lone selves, penalty included: --batch 4 gives --batch 1's track."""
    tracks = []
    for batch in ("1", "4"):
        out = tmp_path / f"b{batch}.srt"
        args = ["caption", "-i", str(DEMO_CLIP), "--model", str(tiny_checkpoint), "--fps", "2", "--window", "2"]
        code = run([*args, "--max-new-tokens", "12", "--repetition-penalty", "1.3", "--batch", batch, "-o", str(out)])
        assert code == 0, capsys.readouterr().err
        tracks.append(out.read_text(encoding="utf-8"))
    assert tracks[0] == tracks[1] and tracks[0].count("-->") == 12
