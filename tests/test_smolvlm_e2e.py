"""The whole engine path — our preprocessing, prompt, towers and generation, as `ffai caption`
runs them — against transformers' processor + model on the same checkpoint and the same image.

Gates 5 (end to end) and 6 (the public surface prints exactly the reference's text). The
per-stage gates live in test_smolvlm_preprocess/prompt/model.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine_requests import request
from ffai.engines.contract import DecodingOptions, RuntimeOptions
from ffai.engines.smolvlm import ENGINE
from ffai.run.inline import InlineEngine
from test_smolvlm_model import TINY_SIZES, processor_inputs, random_image, reference_generate

pytestmark = pytest.mark.oracle

N_NEW = 32
QUESTION = "Describe this image."


def ours_forced(model, images, *, split: bool) -> list[int]:
    options = DecodingOptions(max_new_tokens=N_NEW, force_new_tokens=True)
    return model["text"].generate_ids(model.through(request(images, options, still=split), "vision"))


def theirs_forced(ref, processor, images, *, split: bool) -> list[int]:
    tokens, _ = reference_generate(ref, processor_inputs(processor, images, split=split, question=QUESTION), n=N_NEW)
    return tokens


@pytest.fixture(scope="module")
def tiny_pair(one_torch_thread, tiny_checkpoint, reference_loader):
    # One thread: 24 small greedy runs a test, where two threads spin-wait on shared cores.
    torch.manual_seed(0)
    ref, processor = reference_loader(tiny_checkpoint)
    return InlineEngine(ENGINE, tiny_checkpoint, RuntimeOptions()), ref, processor


@pytest.mark.parametrize("split", [True, False], ids=["still", "frame"])
def test_tiny_end_to_end_tokens_on_random_images(tiny_pair, split):
    model, ref, processor = tiny_pair
    for seed, size in enumerate(TINY_SIZES):
        images = [random_image(500 + seed, size)]
        assert ours_forced(model, images, split=split) == theirs_forced(ref, processor, images, split=split), size


def test_tiny_end_to_end_window_of_frames(tiny_pair):
    model, ref, processor = tiny_pair
    frames = [random_image(600 + i, (160, 90)) for i in range(8)]
    options = DecodingOptions(max_new_tokens=N_NEW, force_new_tokens=True)
    prepared = model["preprocess"](request(frames, options, still=False))
    ours = model["text"].generate_ids(model["vision"](prepared))
    # The reference is asked the same question our engine asks of a window.
    inputs = processor_inputs(processor, frames, split=False, question="Describe what happens in these frames.")
    assert prepared.input_ids == inputs["input_ids"][0].tolist()
    assert ours == reference_generate(ref, inputs, n=N_NEW)[0]


def test_cli_prints_exactly_the_reference_text(tiny_checkpoint, reference_loader, tmp_path):
    """Gate 6: `ffai caption -i image.png --model CKPT --max-new-tokens 32` vs the reference's decode."""
    ref, processor = reference_loader(tiny_checkpoint)
    image = random_image(700, (400, 300))
    path = tmp_path / "image.png"
    image.save(path)
    inputs = processor_inputs(processor, [image], split=True, question=QUESTION)
    with torch.no_grad():
        out = ref.generate(**inputs, max_new_tokens=N_NEW, do_sample=False)
    expected = processor.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)[0]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ffai",
            "caption",
            "-i",
            str(path),
            "--model",
            str(tiny_checkpoint),
            "--max-new-tokens",
            str(N_NEW),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert expected.strip(), "the reference produced no text; pick another image"
    assert proc.stdout == expected.strip() + "\n"


@pytest.mark.real
def test_real_config_end_to_end_frame(real_checkpoint, reference_loader):
    """Gate 5 end to end on the real 256M shapes: one unsplit video frame, 32 forced tokens."""
    ref, processor = reference_loader(real_checkpoint)
    model = InlineEngine(ENGINE, real_checkpoint, RuntimeOptions())
    images = [random_image(800, (640, 360))]
    assert ours_forced(model, images, split=False) == theirs_forced(ref, processor, images, split=False)
