"""The SmolVLM port against transformers on the same checkpoint and the same processor inputs.

Gates: 3 (vision + connector, relative error <= 1e-5), 4 (prefill logits, abs error <= 1e-4),
5 (greedy tokens identical for 32 forced new tokens), 7 (cached decoding == recomputation).
Inputs always come from transformers' own processor, so only the model is under test here.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from PIL import Image

from ffai.engines.contract import DecodingOptions
from ffai.engines.smolvlm.precision import plan_precision
from ffai.engines.smolvlm.preprocess import ProcessorConfig, normalise, preprocess_images
from ffai.engines.smolvlm.stages import STAGES
from ffai.errors import EngineError, UsageError
from kit_calls import generate_from, tower

load_model = STAGES.load_model

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("one_torch_thread")]


N_NEW = 32
VISION_REL_TOL = 1e-5
LOGITS_ABS_TOL = 1e-4


def stop_ids(path) -> list[int]:
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


def random_image(seed: int, size: tuple[int, int]) -> Image.Image:
    """A (width, height) image: smooth colour gradients plus noise, so resizing keeps structure."""
    rng = np.random.RandomState(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w] / max(w, h)
    base = np.stack([np.sin(xx * rng.uniform(2, 9) + c) * np.cos(yy * rng.uniform(2, 9)) for c in range(3)], -1)
    pixels = (base * 80 + 128 + rng.normal(0, 25, (h, w, 3))).clip(0, 255)
    return Image.fromarray(pixels.astype(np.uint8))


def processor_inputs(processor, images, *, split: bool, question: str = "Describe this image."):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return processor(text=text, images=images, return_tensors="pt", do_image_splitting=split)


def generate(model, input_ids, embeds, options, stops, on_token=None) -> list[int]:
    return generate_from(model, input_ids, embeds, options=options, stop_ids=stops, on_token=on_token)


def forced(model, inputs, embeds, n: int, stops: list[int], **kwargs) -> list[int]:
    """Our generation of exactly ``n`` tokens for processor ``inputs``."""
    options = DecodingOptions(max_new_tokens=n, force_new_tokens=True, **kwargs)
    return generate(model, inputs["input_ids"], embeds, options, stops)


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max|a - b| / max|b|."""
    return float((ours - theirs).abs().max() / theirs.abs().max())


def reference_generate(ref, inputs, n: int = N_NEW, **kwargs):
    """transformers' greedy tokens (forced to ``n``) and the connector output it computed."""
    captured = []
    hook = ref.model.connector.register_forward_hook(lambda mod, args, out: captured.append(out.detach()))
    try:
        with torch.no_grad():
            out = ref.generate(**inputs, max_new_tokens=n, do_sample=False, **{"min_new_tokens": n, **kwargs})
    finally:
        hook.remove()
    assert len(captured) == 1, "the reference ran its vision tower more than once"
    return out[0, inputs["input_ids"].shape[1] :].tolist(), captured[0]


def run_case(model, ref, processor, images, *, split: bool, stops: list[int]) -> dict:
    """Both models on one prompt: our image embeddings and tokens, the reference's (one vision pass each)."""
    inputs = processor_inputs(processor, images, split=split)
    t0 = time.perf_counter()
    embeds = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    ours = forced(model, inputs, embeds, N_NEW, stops)
    t1 = time.perf_counter()
    theirs, ref_embeds = reference_generate(ref, inputs)
    t2 = time.perf_counter()
    return {
        "inputs": inputs,
        "embeds": embeds,
        "ref_embeds": ref_embeds,
        "ours": ours,
        "theirs": theirs,
        "ours_s": round(t1 - t0, 2),
        "ref_s": round(t2 - t1, 2),
    }


def check_case(model, ref, processor, images, *, split: bool, stops: list[int]) -> dict:
    """Gates 3 and 5 for one prompt; returns tile count, error and timings for the report."""
    return check_run(run_case(model, ref, processor, images, split=split, stops=stops))


def check_run(run: dict) -> dict:
    embeds, ref_embeds = run["embeds"], run["ref_embeds"]
    assert embeds.shape == ref_embeds.shape
    err = rel_err(embeds, ref_embeds)
    assert err <= VISION_REL_TOL, f"vision+connector relative error {err:.2e}"
    assert len(run["ours"]) == N_NEW and run["ours"] == run["theirs"]
    return {
        "tiles": embeds.shape[0],
        "prompt": run["inputs"]["input_ids"].shape[1],
        "vision_rel": err,
        "ours_s": run["ours_s"],
        "ref_s": run["ref_s"],
    }


def reference_logits(ref, inputs, ref_embeds: torch.Tensor) -> torch.Tensor:
    """The reference's full forward on its own (already computed) image features: every position's logits."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    features = {"image": BaseModelOutputWithPooling(pooler_output=[ref_embeds.reshape(-1, ref_embeds.shape[-1])])}
    with torch.no_grad():
        return ref(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], mm_encoder_outputs=features
        ).logits


def our_logits(model, inputs, embeds: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        x = model.embed(inputs["input_ids"], embeds)
        return tower(model.text, x)  # (1, T, vocab), no cache


# --- real SmolVLM-256M shapes (random weights) ---------------------------------------------


@pytest.fixture(scope="module")
def real(real_checkpoint, reference_loader):
    ref, processor = reference_loader(real_checkpoint)
    return load_model(real_checkpoint), ref, processor, stop_ids(real_checkpoint)


REAL_CASES = {
    "frame": ([random_image(1, (640, 360))], False),
    # 2 frames, for the suite's time: SmolVLM2-256M's 4-frame window (same towers) is gated in
    # test_smolvlm2_oracle.py.
    "window2": ([random_image(10 + i, (320, 240)) for i in range(2)], False),
}
# A split still at these towers' shapes: SmolVLM2-256M's (4 tiles + the global image) in
# test_smolvlm2_oracle.py; SmolVLM's splitting is gated on the tiny checkpoint here.
REAL_TILES = {"frame": 1, "window2": 2}


@pytest.fixture(scope="module")
def real_frame(real) -> dict:
    """The one-frame run, shared by gates 3/5 and gate 4 so the frame's tile is encoded once per model."""
    images, split = REAL_CASES["frame"]
    return run_case(*real[:3], images, split=split, stops=real[3])


@pytest.mark.real
@pytest.mark.parametrize("case", list(REAL_CASES))
def test_real_vision_and_greedy_tokens(real, real_frame, case):
    """Gates 3 and 5 on the real config: a frame and a 2-frame window."""
    model, ref, processor, stops = real
    images, split = REAL_CASES[case]
    run = real_frame if case == "frame" else run_case(model, ref, processor, images, split=split, stops=stops)
    report = check_run(run)
    assert report["tiles"] == REAL_TILES[case]
    print(f"{case}: {report}")


@pytest.mark.real
def test_real_prefill_logits(real, real_frame):
    """Gate 4: every position's logits for the frame's prompt."""
    model, ref, _, _ = real
    want = reference_logits(ref, real_frame["inputs"], real_frame["ref_embeds"])
    got = our_logits(model, real_frame["inputs"], real_frame["embeds"])
    err = float((got - want).abs().max())
    print(f"prefill logits: max abs error {err:.2e} over {tuple(want.shape)}, max |logit| {want.abs().max():.2f}")
    assert err <= LOGITS_ABS_TOL


def padded_tiles(inputs, size: int, h: int, w: int):
    """The processor's tiles plus a non-square padded one (only h x w real) and an all-zero tile."""
    pixels, mask = inputs["pixel_values"][0], inputs["pixel_attention_mask"][0]  # (n, 3, S, S), (n, S, S)
    part = torch.zeros(1, 3, size, size)
    part[0, :, :h, :w] = pixels[0, :, :h, :w]
    part_mask = torch.zeros(1, size, size, dtype=mask.dtype)
    part_mask[0, :h, :w] = 1
    empty, empty_mask = torch.zeros(1, 3, size, size), torch.zeros(1, size, size, dtype=mask.dtype)
    return torch.cat([pixels, part, empty])[None], torch.cat([mask, part_mask, empty_mask])[None]


@pytest.mark.real
def test_real_padded_tile(real):
    """Gate 3 for a padded, non-square tile (bucketized position ids) and a dropped padding tile."""
    model, ref, processor, _ = real
    inputs = processor_inputs(processor, [random_image(4, (400, 300))], split=False)
    pixels, mask = padded_tiles(inputs, 512, h=512, w=300)  # width 300 px: 19 patches, the last partial
    with torch.no_grad():
        want = torch.stack(ref.model.get_image_features(pixels, mask).pooler_output)[0].view(2, 64, -1)
        got = model.encode_images(pixels, mask)
    assert got.shape == want.shape == (2, 64, 576)
    assert rel_err(got, want) <= VISION_REL_TOL


# --- tiny config: many images, cache and sampling ------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint, reference_loader):
    ref, processor = reference_loader(tiny_checkpoint)
    return load_model(tiny_checkpoint), ref, processor, stop_ids(tiny_checkpoint)


TINY_SIZES = [
    (300, 200),
    (64, 64),
    (1000, 90),
    (90, 700),
    (256, 256),
    (33, 47),
    (640, 480),
    (128, 300),
    (1920, 1080),
    (75, 75),
    (200, 600),
    (512, 128),
]


@pytest.mark.parametrize("split", [True, False], ids=["still", "frame"])
def test_tiny_greedy_tokens_on_random_images(tiny, split):
    """Gates 3 and 5 on the tiny geometry: 12 random images, split into tiles or not."""
    model, ref, processor, stops = tiny
    tiles = []
    for seed, size in enumerate(TINY_SIZES):
        report = check_case(model, ref, processor, [random_image(100 + seed, size)], split=split, stops=stops)
        tiles.append(report["tiles"])
    assert (max(tiles) > 5) if split else (set(tiles) == {1})


def test_tiny_window_of_frames(tiny):
    model, ref, processor, stops = tiny
    images = [random_image(200 + i, (160, 90)) for i in range(6)]
    assert check_case(model, ref, processor, images, split=False, stops=stops)["tiles"] == 6


def test_tiny_prefill_logits_and_padded_tiles(tiny):
    model, ref, processor, _ = tiny
    inputs = processor_inputs(processor, [random_image(5, (300, 120))], split=True)
    with torch.no_grad():
        want = ref(**inputs).logits  # end to end here: the reference computes its own image features
        got = our_logits(model, inputs, model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"]))
        assert (got - want).abs().max() <= LOGITS_ABS_TOL
        # The real-config gate 4 feeds the reference its own image features; that is the same forward.
        ref_embeds = torch.cat(
            ref.model.get_image_features(inputs["pixel_values"], inputs["pixel_attention_mask"]).pooler_output
        )
        assert torch.equal(reference_logits(ref, inputs, ref_embeds), want)
        pixels, mask = padded_tiles(inputs, 64, h=37, w=20)
        want = torch.stack(ref.model.get_image_features(pixels, mask).pooler_output)[0]
        got = model.encode_images(pixels, mask)
    assert got.shape[0] == inputs["pixel_values"].shape[1] + 1  # the all-zero tile is dropped
    assert rel_err(got.reshape(want.shape), want) <= VISION_REL_TOL


def test_uint8_tiles_normalised_one_at_a_time_give_the_processors_features(tiny, tiny_checkpoint):
    """The engine's path: uint8 tiles, each normalised as the tower takes it. The features are
    the reference processor's float tiles' bit for bit, and an all-black tile (all zeros in
    uint8, not padding) is encoded, not dropped."""
    model, ref, processor, _ = tiny
    cfg = ProcessorConfig.from_dir(tiny_checkpoint)
    image = random_image(8, (300, 200))
    inputs = processor_inputs(processor, [image, Image.new("RGB", (40, 30))], split=True)
    batch = preprocess_images([image, Image.new("RGB", (40, 30))], cfg, split=True)
    assert torch.equal(normalise(batch.tiles, cfg), inputs["pixel_values"][0])
    assert not batch.tiles[-1].any()  # the black image's global tile
    with torch.no_grad():
        want = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
        got = model.encode_images(batch.tiles, batch.pixel_attention_mask, lambda t: normalise(t, cfg))
    assert torch.equal(got, want) and got.shape[0] == batch.tiles.shape[0]


def test_batch_padding_tiles_are_dropped(tiny):
    """Two prompts with different tile counts: the processor pads with all-zero tiles."""
    model, ref, processor, _ = tiny
    still = processor_inputs(processor, [random_image(6, (256, 256))], split=True)
    n_still = still["pixel_values"].shape[1]
    content = [{"type": "image"}, {"type": "text", "text": "Hi"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(
        text=[text, text],
        images=[[random_image(6, (256, 256))], [random_image(7, (90, 60))]],
        return_tensors="pt",
        padding=True,
    )
    assert inputs["pixel_values"].shape[:2] == (2, n_still)
    assert inputs["pixel_values"][1].flatten(1).abs().sum(1).eq(0).any()  # some tiles are padding
    with torch.no_grad():
        features = ref.model.get_image_features(inputs["pixel_values"], inputs["pixel_attention_mask"])
        want = torch.cat(features.pooler_output)
        got = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    assert got.shape[0] * got.shape[1] == want.shape[0]
    assert rel_err(got.reshape(want.shape), want) <= VISION_REL_TOL


def test_stop_token_ends_generation_like_reference(tiny):
    """Without forcing, a stop id ends the output; the reference keeps it as its last token."""
    model, ref, processor, stops = tiny
    inputs = processor_inputs(processor, [random_image(8, (200, 100))], split=False)
    embeds = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    all32 = forced(model, inputs, embeds, N_NEW, stops)
    stop = all32[4]  # pretend the 5th greedy token is the end-of-utterance token
    ours = generate(model, inputs["input_ids"], embeds, DecodingOptions(max_new_tokens=N_NEW), [stop])
    theirs, _ = reference_generate(ref, inputs, min_new_tokens=0, eos_token_id=stop)
    assert ours == all32[: all32.index(stop)]
    assert theirs == ours + [stop]
    unforced = generate(model, inputs["input_ids"], embeds, DecodingOptions(max_new_tokens=N_NEW), stops)
    assert unforced == reference_generate(ref, inputs, min_new_tokens=0)[0][: len(unforced)]


def test_cached_decoding_equals_recomputation(tiny):
    """Gate 7: each cached greedy token equals the argmax of a cache-free pass over the prefix."""
    model, _, processor, stops = tiny
    inputs = processor_inputs(processor, [random_image(9, (300, 300))], split=True)
    embeds = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    ids = inputs["input_ids"]
    tokens = generate(model, ids, embeds, DecodingOptions(max_new_tokens=20, force_new_tokens=True), stops)
    with torch.no_grad():
        x = model.embed(torch.cat([ids, torch.tensor([tokens[:-1]])], dim=1), embeds)
        logits = tower(model.text, x)  # no cache: the whole sequence at once
    recomputed = logits[0, ids.shape[1] - 1 :].argmax(-1).tolist()
    assert recomputed == tokens


def test_chunked_prefill_matches_one_pass(tiny):
    """A prompt prefilled in two chunks (the second attends to the cached first) gives the same logits."""
    model, _, processor, _ = tiny
    inputs = processor_inputs(processor, [random_image(10, (128, 128))], split=False)
    embeds = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    with torch.no_grad():
        x = model.embed(inputs["input_ids"], embeds)
        t, h = x.shape[1], x.shape[1] // 2
        whole = tower(model.text, x)
        cache = model.text.new_cache(1, t + 7)
        first = tower(model.text, x[:, :h], 0, cache)
        second = tower(model.text, x[:, h:], h, cache)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=0, atol=1e-5)


def test_cache_is_reused_and_grown_only_when_needed(tiny, tiny_checkpoint):
    model, _, processor, stops = tiny
    fresh = load_model(tiny_checkpoint)
    long_in = processor_inputs(processor, [random_image(11, (256, 256))], split=True)
    short_in = processor_inputs(processor, [random_image(12, (64, 64))], split=False)

    def run(m, inputs, n):
        e = m.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
        return forced(m, inputs, e, n, stops)

    text = model.text
    text.cache = None
    first = run(model, short_in, 8)
    cache = text.cache
    assert cache.max_len >= short_in["input_ids"].shape[1] + 8
    assert run(model, short_in, 8) == first and text.cache is cache  # reused, same answer
    long_tokens = run(model, long_in, 16)
    assert text.cache is not cache and text.cache.max_len >= long_in["input_ids"].shape[1] + 16
    grown = text.cache
    assert run(model, short_in, 8) == first and text.cache is grown  # stale longer contents never leak
    assert run(fresh, long_in, 16) == long_tokens
    assert text.reserve_cache(1, 10) is grown


def test_image_token_count_is_checked(tiny):
    model, _, processor, _ = tiny
    inputs = processor_inputs(processor, [random_image(13, (64, 64))], split=False)
    embeds = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    with pytest.raises(EngineError, match="the prompt has 16 image tokens but the images gave 32 embeddings"):
        model.embed(inputs["input_ids"], torch.cat([embeds, embeds]))
    with pytest.raises(EngineError, match="the prompt has 16 image tokens but the images gave 0"):
        model.embed(inputs["input_ids"], None)


def test_sampling_is_reproducible_with_a_seed(tiny):
    model, _, processor, stops = tiny
    inputs = processor_inputs(processor, [random_image(14, (128, 96))], split=False)
    embeds = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])

    def run(**kw):
        return forced(model, inputs, embeds, 16, stops, **kw)

    a = run(temperature=1.5, top_p=0.95, top_k=50, seed=7)
    assert a == run(temperature=1.5, top_p=0.95, top_k=50, seed=7)
    assert a != run(temperature=1.5, top_p=0.95, top_k=50, seed=8)
    assert run(temperature=1.0, top_k=1, seed=3) == run()  # top-1 sampling is greedy
    # Refused once, by DecodingOptions, before anything reaches the model.
    with pytest.raises(UsageError, match="needs --seed"):
        run(temperature=0.7)
    with pytest.raises(UsageError, match="need --temperature > 0"):
        run(top_k=5, seed=1)


def test_on_token_streams_each_token_and_context_is_checked(tiny):
    model, _, processor, stops = tiny
    inputs = processor_inputs(processor, [random_image(15, (64, 64))], split=False)
    embeds = model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    seen = []
    out = generate(
        model,
        inputs["input_ids"],
        embeds,
        DecodingOptions(max_new_tokens=5, force_new_tokens=True),
        stops,
        on_token=seen.append,
    )
    assert seen == out and len(out) == 5
    limit = model.cfg.text.max_position_embeddings
    with pytest.raises(EngineError, match=f"exceeds the model's context of {limit}"):
        generate(model, inputs["input_ids"], embeds, DecodingOptions(max_new_tokens=limit), stops)


def test_bfloat16_loads_and_generates(tiny, tiny_checkpoint):
    """No equality is promised in bfloat16; report how many greedy tokens agree with float32."""
    model, _, processor, stops = tiny
    bf16 = load_model(tiny_checkpoint, plan_precision("bfloat16"))
    agree = total = 0
    for seed in range(4):
        inputs = processor_inputs(processor, [random_image(300 + seed, (200, 150))], split=True)
        outs = []
        for m in (model, bf16):
            e = m.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
            assert e.dtype == m.dtype
            outs.append(forced(m, inputs, e, N_NEW, stops))
        assert len(outs[1]) == N_NEW
        prefix = next((i for i, (a, b) in enumerate(zip(*outs)) if a != b), N_NEW)
        agree, total = agree + prefix, total + N_NEW
    print(f"bfloat16 vs float32: identical greedy prefix {agree}/{total} tokens")


def test_parts_load_only_what_a_worker_needs(tiny, tiny_checkpoint):
    """The pipeline's vision and text workers each load one part; together they equal the whole."""
    model, _, processor, stops = tiny
    vision = load_model(tiny_checkpoint, parts=("vision",))
    text = load_model(tiny_checkpoint, parts=("text",))
    assert vision.text is None and text.vision is None and text.connector is None
    assert all(name.startswith(("vision.", "connector.")) for name, _ in vision.named_parameters())
    inputs = processor_inputs(processor, [random_image(16, (100, 80))], split=True)
    embeds = vision.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    assert torch.equal(embeds, model.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"]))
    with torch.inference_mode():  # as the pipeline's workers call it
        split_run = forced(text, inputs, embeds, 8, stops)
    # The cache made under inference_mode is an ordinary tensor, so a plain call can reuse it.
    assert forced(text, inputs, embeds, 8, stops) == split_run
    assert forced(model, inputs, embeds, 8, stops) == split_run
    with pytest.raises(EngineError, match="loaded without its text part"):
        vision.embed(inputs["input_ids"], embeds)
    with pytest.raises(EngineError, match="loaded without its vision part"):
        text.encode_images(inputs["pixel_values"], inputs["pixel_attention_mask"])
    with pytest.raises(ValueError, match="parts must be"):
        load_model(tiny_checkpoint, parts=("audio",))
