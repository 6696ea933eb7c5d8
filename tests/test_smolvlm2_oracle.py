"""SmolVLM2 (``model_type: smolvlm``) through the smolvlm engine against transformers'
SmolVLMProcessor + SmolVLMForConditionalGeneration on the same random-weight checkpoints.

Windows as video (frames passed with their times from the window's start, the window's span
as the clip's duration), windows as pictures and stills: processor pixels and prompt ids equal,
vision features bit-equal, prefill logits within v1's bound, 32 greedy tokens identical; and the
whole CLI path's text equal to the reference's decode. The tiny checkpoint runs in CI's fast
half; the real SmolVLM2-256M-Video shapes under ``real``, and 500M-Video's with
``FFAI_SMOLVLM2_500M=1`` (CI runs it after the suite, for the suite's 15 minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ffai.bench import cases, checkpoints
from ffai.bench.engine_hooks import prefill_logits
from ffai.engines.contract import DecodingOptions, Request, RuntimeOptions
from ffai.engines.smolvlm import ENGINE
from ffai.engines.smolvlm.bench.reference import ReferenceArm, reference_inputs
from ffai.engines.smolvlm.preprocess import normalise
from ffai.run.inline import InlineEngine
from test_smolvlm_model import LOGITS_ABS_TOL, random_image, reference_generate, reference_logits

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("one_torch_thread")]

N_NEW = 32
FORCED = DecodingOptions(max_new_tokens=N_NEW, force_new_tokens=True)
# (frames, first frame's time in the source, seconds between frames): minutes and hours in the
# source; the 64-frame window (the processor's max_frames) spans 1:45:00, so its own frame
# times pass an hour too ("Frame from 105:00:"), as its duration does.
WINDOWS = [(1, 3725.3, 1.0), (2, 61.7, 1.0), (8, 3600.25, 2.0), (64, 7201.0, 100.0)]


@pytest.fixture(scope="module")
def v2_tiny() -> Path:
    return checkpoints.checkpoint("v2-tiny")


@pytest.fixture(scope="module")
def tiny_pair(v2_tiny, reference_loader):
    ref, processor = reference_loader(v2_tiny)
    return InlineEngine(ENGINE, v2_tiny, RuntimeOptions()), ref, processor, v2_tiny


def window(n: int, start: float, step: float, size=(160, 90), options: DecodingOptions = FORCED) -> Request:
    frames = [random_image(900 + i, size) for i in range(n)]
    times = [start + i * step for i in range(n)]
    return Request.frames(frames, times, options, span=(start, start + n * step))


def check_request(model, ref, processor, model_dir, request: Request) -> dict:
    """Every gate on one request; returns the prompt for further checks."""
    inputs = reference_inputs(processor, request.images, request.times, request.span, request.options, model_dir)
    prepared = model["preprocess"](request)
    cfg = model["vision"].normalise.keywords["cfg"]
    assert torch.equal(normalise(prepared.tiles, cfg), inputs["pixel_values"][0])
    assert prepared.input_ids == inputs["input_ids"][0].tolist()
    encoded = model["vision"](prepared)
    theirs, ref_embeds = reference_generate(ref, inputs, n=N_NEW)
    assert torch.equal(encoded.visual.reshape(ref_embeds.shape), ref_embeds)
    want = reference_logits(ref, inputs, ref_embeds)[0, -1]
    assert float((prefill_logits(model, encoded) - want).abs().max()) <= LOGITS_ABS_TOL
    ours = model["text"].generate_ids(encoded)
    assert len(ours) == N_NEW and ours == theirs
    return {"text": processor.tokenizer.decode(prepared.input_ids), "tiles": prepared.tiles.shape[0]}


@pytest.mark.parametrize("n, start, step", WINDOWS, ids=[f"{w[0]}-frames" for w in WINDOWS])
def test_tiny_window_as_video(tiny_pair, n, start, step):
    model, ref, processor, model_dir = tiny_pair
    prompt = check_request(model, ref, processor, model_dir, window(n, start, step))["text"]
    # The window is its own clip: times from its start, its span as the duration.
    duration = {1: "0:00:01", 2: "0:00:02", 8: "0:00:16", 64: "1:46:40"}[n]
    assert f"frames from a {duration} [H:MM:SS] video." in prompt
    assert prompt.count("Frame from ") == n and "Frame from 00:00:" in prompt
    if n == 64:
        assert "sixty-four frames" in prompt and "Frame from 105:00:" in prompt


def test_tiny_window_as_images_and_stills(tiny_pair):
    model, ref, processor, model_dir = tiny_pair
    images = DecodingOptions(max_new_tokens=N_NEW, force_new_tokens=True, window_as="images")
    prompt = check_request(model, ref, processor, model_dir, window(3, 60.0, 1.0, options=images))["text"]
    assert "video" not in prompt and "Describe what happens in these frames." in prompt
    for seed, size in enumerate([(400, 300), (90, 700), (64, 64), (1000, 80)]):
        still = Request((random_image(500 + seed, size),), FORCED)
        check_request(model, ref, processor, model_dir, still)


def test_cli_window_text_equals_the_references_decode(v2_tiny, tmp_path):
    """`ffai caption` on a clip (windows as video, the default for this checkpoint): every cue's
    text is the reference's decode of the same window, presented the same way."""
    clip = cases.write_clip(tmp_path / "clip.mp4")
    proc = subprocess.run(
        [sys.executable, "-m", "ffai", "caption", "-i", str(clip), "--model", str(v2_tiny), "-f", "json"]
        + ["--fps", str(cases.CLIP_FPS), "--window", str(cases.CLIP_WINDOW), "--max-new-tokens", str(N_NEW)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    cues = json.loads(proc.stdout)["cues"]
    arm = ReferenceArm(v2_tiny, cores=1)
    arm.load()
    items = list(cases.clip_items(clip))
    assert len(cues) == len(items) == 6
    for cue, item in zip(cues, items):
        _, text = arm.answer(item, DecodingOptions(max_new_tokens=N_NEW))
        assert text.strip() and cue["text"] == text.strip()


# 500M's text tower (SmolLM2-360M: 960 wide, 15 heads over 5 key heads) is the one thing it adds
# to 256M's gate: ~60 s of a 2-core Zen 4's suite, so CI runs it after the suite, as Qwen3-VL's 2B.
REAL_500M = pytest.mark.skipif(
    os.environ.get("FFAI_SMOLVLM2_500M") != "1", reason="the 500M shapes take a minute: set FFAI_SMOLVLM2_500M=1"
)


@pytest.fixture(scope="module", params=["v2-256m", pytest.param("v2-500m", marks=REAL_500M)])
def real_pair(request, reference_loader):
    path = checkpoints.checkpoint(request.param)
    ref, processor = reference_loader(path)
    return InlineEngine(ENGINE, path, RuntimeOptions()), ref, processor, path


@pytest.mark.real
def test_real_window_as_video_and_still(real_pair):
    """The real SmolVLM2-256M-Video and 500M-Video shapes: a window as video (4 640x360 frames, for
    the suite's time: the bench's window is 8, which the tiny checkpoint's 64-frame window
    outnumbers); on 256M also a 1280x320 still (tiled: first to a 2048 long edge, so a row of 4
    tiles and the global image; the tiny checkpoint gates more rows and other sizes), left out
    on 500M for the suite's time (a 13-tile still here took 80 s of a 2-core Zen 4's run)."""
    model, ref, processor, model_dir = real_pair
    assert check_request(model, ref, processor, model_dir, window(4, 3600.25, 2.0, size=(640, 360)))["tiles"] == 4
    if model_dir.name.startswith("smolvlm-v2-256m"):
        still = Request((random_image(42, (1280, 320)),), FORCED)
        assert check_request(model, ref, processor, model_dir, still)["tiles"] == 5
