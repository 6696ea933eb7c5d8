"""The whole path, file to printed answer: ``ffai caption -i FILE --model CKPT`` against transformers
handed ``PIL.Image.open(FILE)``, on the tiny random checkpoint (issue #13).

The per-stage gates feed both sides the same in-memory image, so they cannot see what the media
layer does to a file before the engine gets it, nor what the CLI does to the answer after. Here:

- files whose transparent pixels hide strongly non-white colour (RGBA with partial alpha, LA, a
  palette PNG with a tRNS chunk), where dropping alpha instead of compositing onto white changes
  the pixels a lot, and files the reference converts by clipping (16-bit PNG, float TIFF) or by
  Pillow's CMYK conversion (CMYK JPEG): the engine's pixel values equal the reference processor's,
  its tokens equal the reference's, and the CLI prints (and the json track holds) exactly the
  reference's decoded text;
- an answer with line breaks, blank lines and runs of spaces (a copy of the tiny checkpoint whose
  lm_head makes line-break tokens win where some common tokens would): stdout is the reference's
  text with only surrounding whitespace stripped, json holds it exactly, srt folds it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import srt
import torch
from PIL import Image

import ffai
from ffai import media
from ffai.cli import run
from ffai.engines.contract import DecodingOptions, Request, RuntimeOptions
from ffai.engines.smolvlm import ENGINE
from ffai.outputs.tracks import fold_line_breaks
from ffai.run.inline import InlineEngine
from ffai.run.options import CaptionOptions
from test_smolvlm_model import processor_inputs, random_image

pytestmark = [
    pytest.mark.oracle,
    # Pillow's advice when a palette with per-entry alpha is converted: both sides convert it alike.
    pytest.mark.filterwarnings("ignore:Palette images with Transparency expressed in bytes"),
]

N_NEW = 24
QUESTION = "Describe this image."  # what `ffai caption` asks of a still
SIZE = (150, 100)


# --- test files --------------------------------------------------------------------------


def _saturated(seed: int) -> np.ndarray:
    """(h, w, 3) uint8 of dark, saturated colour blocks with noise: far from white everywhere."""
    rng = np.random.default_rng(seed)
    w, h = SIZE
    palette = np.array([[200, 0, 0], [0, 160, 0], [0, 0, 220], [20, 20, 20], [150, 0, 150], [0, 120, 140]])
    blocks = rng.integers(0, len(palette), (h // 10 + 1, w // 10 + 1))
    pixels = palette[blocks.repeat(10, 0).repeat(10, 1)[:h, :w]] + rng.integers(-20, 21, (h, w, 3))
    return pixels.clip(0, 255).astype(np.uint8)


def _alpha(seed: int) -> np.ndarray:
    """(h, w) uint8: fully transparent bands, partial gradients and opaque areas."""
    w, h = SIZE
    x = np.arange(w)[None, :].repeat(h, 0)
    y = np.arange(h)[:, None].repeat(w, 1)
    alpha = (x * 255 // (w - 1) + (y % 25) * 4 + seed).clip(0, 255)
    alpha[(y // 20) % 3 == 0] = 0
    return alpha.astype(np.uint8)


def _rgba(path: Path) -> Path:
    Image.fromarray(np.dstack([_saturated(1), _alpha(1)]), "RGBA").save(path)
    return path


def _la(path: Path) -> Path:
    grey = (_saturated(2).mean(axis=2) * 0.5).astype(np.uint8)  # dark grey
    Image.fromarray(np.dstack([grey, _alpha(2)]), "LA").save(path)
    return path


def _palette_trns(path: Path) -> Path:
    image = Image.fromarray(_saturated(3)).quantize(16, dither=Image.Dither.NONE)
    alphas = bytes([0, 255, 96, 0, 255, 160, 0, 40, 255, 0, 200, 0, 255, 64, 0, 255])
    image.save(path, transparency=alphas)  # a tRNS chunk with one alpha per palette entry
    return path


def _png16(path: Path) -> Path:
    w, h = SIZE
    ramp = np.linspace(0, 700, w)[None, :] + np.random.default_rng(4).normal(0, 60, (h, w))
    Image.fromarray(ramp.clip(0, 65535).astype(np.uint16)).save(path)  # 16-bit grey, mostly above 255
    return path


def _float_tiff(path: Path) -> Path:
    w, h = SIZE
    values = np.linspace(-80, 400, w, dtype=np.float32)[None, :] + np.zeros((h, 1), np.float32)
    Image.fromarray(values + np.float32(0.25), "F").save(path)
    return path


def _cmyk_jpeg(path: Path) -> Path:
    Image.fromarray(_saturated(5)).convert("CMYK").save(path, quality=90)
    return path


def _dropped(image: Image.Image) -> Image.Image:
    """What ffai's media layer used to hand the engine for a transparent file: alpha dropped."""
    return image.convert("RGBA" if image.mode in ("La", "PA") else image.mode).convert("RGB")


def _scaled(image: Image.Image) -> Image.Image:
    """What it used to hand over for a 16-bit file: samples scaled to 8 bits, not clipped."""
    values = np.asarray(image).astype(np.uint32)
    return Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), "L")


def _stretched(image: Image.Image) -> Image.Image:
    """... and for a float file outside 0..1: stretched from its minimum to its maximum."""
    values = np.asarray(image).astype(np.float64)
    return Image.fromarray(np.rint((values - values.min()) / np.ptp(values) * 255).astype(np.uint8), "L")


# name: (writer, file name, Pillow's mode for it, the old media layer's conversion or None when it was the same)
FILES = {
    "rgba": (_rgba, "rgba.png", "RGBA", _dropped),
    "la": (_la, "la.png", "LA", _dropped),
    "palette-trns": (_palette_trns, "palette.png", "P", _dropped),
    "png16": (_png16, "grey16.png", "I;16", _scaled),
    "float-tiff": (_float_tiff, "float.tiff", "F", _stretched),
    "cmyk-jpeg": (_cmyk_jpeg, "cmyk.jpg", "CMYK", None),
}


# --- the two sides -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tiny_checkpoint):
    return InlineEngine(ENGINE, tiny_checkpoint, RuntimeOptions())


def reference_answer(ref, processor, path: Path) -> tuple[list[int], str]:
    """transformers' greedy tokens (its final stop token kept) and decoded text for the file."""
    with Image.open(path) as image:
        inputs = processor_inputs(processor, [image], split=True, question=QUESTION)
    with torch.no_grad():
        out = ref.generate(**inputs, max_new_tokens=N_NEW, do_sample=False)
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    return tokens, processor.decode(tokens, skip_special_tokens=True)


def reference_pixels(processor, image: Image.Image) -> torch.Tensor:
    return processor_inputs(processor, [image], split=True, question=QUESTION)["pixel_values"][0]


def library_answer(path: Path, checkpoint: Path) -> tuple[list[int], str]:
    """The still's one cue through the library's whole path (``ffai.caption``, as the CLI runs it):
    its tokens (stop token left out) and text."""
    (cue,) = ffai.caption(path, CaptionOptions(model=str(checkpoint), decoding=DecodingOptions(max_new_tokens=N_NEW)))
    return list(cue.token_ids), cue.text


def assert_same_tokens(ours: list[int], theirs: list[int], processor) -> None:
    stop = processor.tokenizer.convert_tokens_to_ids("<end_of_utterance>")
    assert theirs in (ours, [*ours, stop])


def cli_answer(capsys, path: Path, checkpoint: Path, *args: str) -> str:
    code = run(["caption", "-i", str(path), "--model", str(checkpoint), "--max-new-tokens", str(N_NEW), *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


# --- files through the whole path ----------------------------------------------------------


@pytest.mark.parametrize("name", list(FILES))
def test_file_through_the_whole_path(name, tmp_path, capsys, tiny_checkpoint, tiny_engine, reference_loader):
    write, file_name, mode, old_conversion = FILES[name]
    path = write(tmp_path / file_name)
    ref, processor = reference_loader(tiny_checkpoint)
    with Image.open(path) as opened:
        assert opened.mode == mode  # the file really is what the case names
        theirs_pixels = reference_pixels(processor, opened)
        # The case can tell: the old media layer's conversion gives the model other pixels.
        if old_conversion is not None:
            assert (reference_pixels(processor, old_conversion(opened)) - theirs_pixels).abs().max() > 0.5

    # The engine's own preprocessing of what the media layer read equals the reference's, exactly.
    still = media.Decoder(isolated=False).load_image(path)
    prepared = tiny_engine["preprocess"](Request((still,), DecodingOptions(max_new_tokens=N_NEW)))
    assert torch.equal(tiny_engine["vision"].normalise(prepared.tiles), theirs_pixels)

    theirs, text = reference_answer(ref, processor, path)
    assert text.strip(), "the reference produced no text; pick another file"
    ours, our_text = library_answer(path, tiny_checkpoint)
    assert_same_tokens(ours, theirs, processor)
    assert our_text == text.strip()

    assert cli_answer(capsys, path, tiny_checkpoint) == text.strip() + "\n"
    track = tmp_path / "track.json"
    cli_answer(capsys, path, tiny_checkpoint, "-o", str(track))
    assert [cue["text"] for cue in json.loads(track.read_text(encoding="utf-8"))["cues"]] == [text.strip()]


def test_premultiplied_la_is_one_error_line(tmp_path, tiny_engine):
    """Pillow cannot convert "La" (nor can the reference); a library caller gets a MediaError."""
    from ffai.errors import MediaError

    with Image.open(_la(tmp_path / "la.png")) as image:
        premultiplied = image.convert("La")
    with pytest.raises(MediaError, match="^cannot convert a La image to RGB"):
        tiny_engine["preprocess"](Request((premultiplied,), DecodingOptions(max_new_tokens=N_NEW)))


# --- an answer with line breaks -------------------------------------------------------------

# Line-break and space-run tokens of the SmolVLM tokenizer, each given 1.01 x the lm_head row of a
# token the tiny checkpoint often says mid-answer, so it wins wherever that token would have.
LINE_BREAK_DONORS = {
    "\n": " flag",
    "\r": " electorate",
    "\r\n": " viewpoints",
    "\n\n\n": " Westminster",
    "   ": " house",
}
BLANK_LINE = re.compile(r"(?:\r\n|\r(?!\n)|\n)[ \t]*(?:\r\n|\r|\n)")  # CR LF is one line break


@pytest.fixture(scope="module")
def line_break_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """A copy of the tiny checkpoint written by the same writer (transformers' save_pretrained),
    its lm_head edited as LINE_BREAK_DONORS says."""
    from transformers import AutoTokenizer, Idefics3ForConditionalGeneration

    out = tmp_path_factory.mktemp("checkpoints") / "tiny-line-breaks"
    shutil.copytree(tiny_checkpoint, out)
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    model = Idefics3ForConditionalGeneration.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    head = model.lm_head.weight
    with torch.no_grad():
        for text, donor in LINE_BREAK_DONORS.items():
            (token,) = tokenizer.encode(text, add_special_tokens=False)
            (donor_token,) = tokenizer.encode(donor, add_special_tokens=False)
            head[token] = head[donor_token] * 1.01
    model.save_pretrained(out, safe_serialization=True)
    return out


def find_line_break_image(ref, processor, folder: Path) -> tuple[Path, list[int], str]:
    """The first of a fixed series of images whose reference answer holds a CR, a blank line and
    a run of spaces inside it (deterministic: the series and the checkpoint are fixed)."""
    for seed in range(16):
        path = folder / f"lines-{seed}.png"
        random_image(seed, (96 + seed * 7, 80)).save(path)
        tokens, text = reference_answer(ref, processor, path)
        inner = text.strip()
        if "\r" in inner and BLANK_LINE.search(inner) and "   " in inner:
            return path, tokens, text
    raise AssertionError("no image of the series gives an answer with line breaks; revisit LINE_BREAK_DONORS")


def test_answer_with_line_breaks_is_printed_as_decoded(tmp_path, capsys, line_break_checkpoint, reference_loader):
    ref, processor = reference_loader(line_break_checkpoint)
    path, theirs, text = find_line_break_image(ref, processor, tmp_path)
    answer = text.strip()

    ours, our_text = library_answer(path, line_break_checkpoint)
    assert_same_tokens(ours, theirs, processor)
    assert our_text == answer

    # stdout (txt, a still): the decoded text with only its surrounding whitespace stripped
    assert cli_answer(capsys, path, line_break_checkpoint) == answer + "\n"
    # json holds it exactly; srt folds each run of line breaks to one, so the cue has no blank line
    track = tmp_path / "answer.json"
    cli_answer(capsys, path, line_break_checkpoint, "-o", str(track))
    assert json.loads(track.read_text(encoding="utf-8"))["cues"][0]["text"] == answer
    subtitles = tmp_path / "answer.srt"
    cli_answer(capsys, path, line_break_checkpoint, "-o", str(subtitles))
    (cue,) = srt.parse(subtitles.read_bytes().decode("utf-8"))
    assert cue.content == fold_line_breaks(answer, "\n") and "\n" in cue.content
