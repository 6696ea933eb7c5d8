"""Answers stream: the engine's incremental decoding, the pipeline carrying the pieces, their
trimming to the cue's text, and the tracks that show them (txt of a still on stdout, jsonl
``--partial``); through the real CLI in a subprocess, read as it writes."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from ffai import media
from ffai.engines.contract import DecodingOptions
from ffai.engines.smolvlm.prompt import PromptBuilder
from ffai.errors import UsageError
from ffai.outputs.cues import Cue
from ffai.outputs.tracks import check_partial, open_track
from ffai.pipeline import Coordinator
from ffai.run.captioner import Captioner, Progress
from ffai.run.options import CaptionOptions
from ffai.run.streaming import StrippedPieces
from pipeline import toy_stages as toy
from test_tracks import CUES, GOLDEN, HEADER, UPDATE, render

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "ffai" / "models" / "bundled" / "smolvlm-demo"
DEMO_CLIP = ROOT / "examples" / "demo_clip.mp4"


@pytest.fixture(scope="module")
def prompts(tiny_checkpoint) -> PromptBuilder:
    return PromptBuilder.from_dir(tiny_checkpoint)  # SmolVLM's own byte-level BPE tokenizer


def _byte_token(prompts: PromptBuilder, byte: int) -> int:
    """The id of the byte-level token for one raw byte (GPT-2's printable stand-ins)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_in = {b: chr(b) for b in printable}
    stand_in.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in stand_in)})
    return prompts._tokenizer.token_to_id(stand_in[byte])


def _streamed(prompts: PromptBuilder, ids: list[int]) -> list[str]:
    stream = prompts.text_stream()
    pieces = [stream.step(i) for i in ids]
    return [*pieces, stream.finish()]


def test_text_stream_holds_split_characters_until_whole(prompts):
    text = " Grüße, 世界 😀🎉 — naïve café\nNext line"
    ids = prompts._tokenizer.encode(text, add_special_tokens=False).ids
    # The test means something only if some token alone is part of a character.
    assert any("\ufffd" in prompts.decode([i]) for i in ids)
    pieces = _streamed(prompts, ids)
    assert "".join(pieces) == prompts.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert pieces[-1] == ""  # nothing was held at the end


def test_text_stream_gives_a_cut_character_at_the_end_as_decode_does(prompts):
    emoji = "😀".encode()  # four bytes, fed as four byte tokens, the last one missing
    ids = [*prompts._tokenizer.encode("hi ", add_special_tokens=False).ids]
    ids += [_byte_token(prompts, b) for b in emoji[:3]]
    pieces = _streamed(prompts, ids)
    assert pieces[: len(ids) - 3] and "".join(pieces[:-1]) == "hi "  # the three bytes held
    assert "".join(pieces) == prompts.decode(ids) and prompts.decode(ids).endswith("\ufffd")
    # ... and completed by the fourth byte, it comes out whole.
    whole = _streamed(prompts, ids + [_byte_token(prompts, emoji[3])])
    assert whole[-2:] == ["😀", ""] and "".join(whole) == "hi 😀"


def test_text_stream_skips_special_tokens_as_decode_does(prompts):
    ids = prompts._tokenizer.encode("a cat", add_special_tokens=False).ids
    ids.insert(1, prompts.end_of_utterance_id)
    assert "".join(_streamed(prompts, ids)) == prompts.decode(ids) == "a cat"


@pytest.mark.parametrize("seed", range(40))
def test_stripped_pieces_add_up_to_the_stripped_answer(seed):
    rng = random.Random(seed)
    alphabet = ["a", "b", "é", " ", "  ", "\n", "\r\n", "\t", "\u2028", "\u3000", "x y"]
    answer = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 14)))
    cuts = sorted(rng.sample(range(len(answer) + 1), min(len(answer) + 1, rng.randrange(0, 6))))
    pieces = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)])]
    stripped = StrippedPieces()
    shown = [stripped.add(piece) for piece in pieces]
    assert "".join(shown) == answer.strip()
    # Nothing shown is ever taken back: no piece shown ends in whitespace that strip removes.
    assert all(not s or not s[-1].isspace() for s in shown)


@pytest.mark.parametrize("placement", ["inline", "workers"])
def test_as_completed_hands_each_requests_chunks_before_its_future(placement):
    seen: list[tuple[str, object]] = []
    pairs = [(tag, {"tag": tag, "n": n, "gap": 0.01}) for tag, n in (("a", 4), ("b", 3), ("c", 5))]
    with Coordinator(toy.producer_only_config(), placement=placement, max_in_flight=2) as pipe:
        for future in pipe.as_completed(pairs, on_chunk=lambda rid, chunk: seen.append((rid, chunk))):
            seen.append((future.request_id, future.result()))
    for tag, n in (("a", 4), ("b", 3), ("c", 5)):
        mine = [item for rid, item in seen if rid == tag]
        assert mine == [f"{tag}{i}" for i in range(n)] + [{"n": n}]


# --- tracks: what a stream shows while answers are generated --------------------------------


def _shown_run(fmt: str, cues, *, partial: bool, header=HEADER, pieces=None) -> str:
    """The stream a run writes: each cue's answer shown piece by piece (words, as a model
    might give them, trimmed as the captioner trims them), then the cue."""
    stream = io.StringIO()
    with open_track("-", fmt, header, overwrite=False, stream=stream, partial=partial) as writer:
        for cue in cues:
            trimmed = StrippedPieces()
            for piece in pieces(cue) if pieces else re.findall(r"\s*\S+|\s+", cue.text):
                if shown := trimmed.add(piece):
                    writer.show(cue.index, shown)
            writer.write(cue)
    return stream.getvalue()


STRIPPED = [dataclasses.replace(cue, text=cue.text.strip()) for cue in CUES]


def test_partial_events_golden():
    out = _shown_run("jsonl", STRIPPED, partial=True)
    golden = GOLDEN / "partial.jsonl"
    if UPDATE:
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in out.splitlines()]
    finals = [line for line in lines if "partial" not in line]
    # The cue lines are those of a run without --partial, and each cue's events come before it,
    # its text so far growing to the cue's text.
    assert "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in finals) == render("jsonl", STRIPPED)
    for cue in STRIPPED:
        at = next(i for i, line in enumerate(lines) if line.get("index") == cue.index and "partial" not in line)
        texts = [line["text"] for line in lines[:at] if line.get("partial") and line["index"] == cue.index]
        assert all(line.keys() == {"partial", "index", "text"} for line in lines[:at] if "partial" in line)
        assert texts == sorted(set(texts), key=len) and (texts[-1] if texts else "") == cue.text
        assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))


def test_a_stills_txt_on_a_stream_is_its_answer_as_generated_then_the_same_bytes():
    still = dataclasses.replace(HEADER, fps=None, window=None)
    cue = Cue(1, 0, 0, (0,), "Line one\n\n  Line two, ünïcode 🌃")
    out = _shown_run("txt", [cue], partial=False, header=still)
    assert out == render_with(still, "txt", [cue]) == cue.text + "\n"
    # a video's txt shows nothing early (one folded line per cue), nor does a file
    assert _shown_run("txt", STRIPPED, partial=False) == render("txt", STRIPPED)


def test_partial_is_refused_where_it_cannot_show(tmp_path):
    with pytest.raises(UsageError, match="--partial needs -f jsonl"):
        check_partial("-", "srt")
    with pytest.raises(UsageError, match="not to the file .*: use -o -"):
        check_partial(str(tmp_path / "a.jsonl"), "jsonl")
    check_partial("-", "jsonl")
    check_partial("/dev/null", "jsonl")


def render_with(header, fmt, cues) -> str:
    stream = io.StringIO()
    with open_track("-", fmt, header, overwrite=False, stream=stream) as writer:
        for cue in cues:
            writer.write(cue)
    return stream.getvalue()


# --- the captioner: pieces come while the text stage still generates ---------------------


def test_first_piece_comes_while_the_answer_is_still_being_generated(still, tiny_checkpoint):
    """By events: when the first piece reaches the caller, the text stage still holds the
    request (the pipeline's own count of requests in its scheduler), and more pieces follow.
    (In worker processes too: the CLI test of --partial below runs there.)"""
    options = CaptionOptions(
        model=str(tiny_checkpoint),
        decoding=DecodingOptions(max_new_tokens=48, force_new_tokens=True),
        placement="inline",
        stream_answers=True,
    )
    seen: list[tuple[int, str, int]] = []

    def on_text(index: int, piece: str) -> None:
        busy = captioner._running().pending_state()["text"]["active"] if not seen else -1
        seen.append((index, piece, busy))

    with Captioner(options, video=False, cores=2) as captioner:
        (cue,) = captioner.captions(media.Decoder().probe(still), Progress(on_text=on_text))
    assert seen[0][2] == 1 and len(seen) > 1
    assert {index for index, _, _ in seen} == {1}
    assert "".join(piece for _, piece, _ in seen) == cue.text and len(cue.token_ids) == 48


# --- through the CLI, read as it writes ------------------------------------------------


def _reads(command: list[str], timeout: float = 120) -> tuple[list[bytes], int, str]:
    """Every read of the command's stdout as it came, its exit status and its stderr."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reads: list[bytes] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(deadline - time.monotonic()):
                continue
            data = os.read(proc.stdout.fileno(), 1 << 16)
            if not data:
                break
            reads.append(data)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return reads, proc.wait(timeout=30), err


def _caption(*args: str) -> list[str]:
    return [sys.executable, "-m", "ffai", "caption", *args]


@pytest.fixture(scope="module")
def still(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("still") / "photo.png"
    Image.new("RGB", (64, 48), (200, 40, 30)).save(path)
    return path


def test_cli_prints_a_stills_answer_piece_by_piece(still, tiny_checkpoint, tmp_path):
    """The answer is on stdout before it is complete (the first read is a part of it), the
    pieces add up to exactly what the json track holds, and the bytes are those a run that
    does not stream writes."""
    # Random weights and 300 tokens: a long answer (about 2 KB, written at once by a run that
    # does not stream, so read at once) generated over hundreds of milliseconds.
    model = ["--model", str(tiny_checkpoint), "--max-new-tokens", "300"]
    reads, code, err = _reads(_caption("-i", str(still), *model))
    assert code == 0, err
    track = tmp_path / "photo.json"
    done = subprocess.run(_caption("-i", str(still), *model, "-o", str(track)), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = json.loads(track.read_text())["cues"][0]["text"]
    streamed = b"".join(reads).decode()
    assert streamed == text + "\n" and len(text) > 500
    assert len(reads) > 1 and len(reads[0]) < len(streamed)


def test_cli_partial_events_come_before_each_cue_and_leave_the_cues_unchanged(tmp_path):
    clip = ["-i", str(DEMO_CLIP), "--model", str(DEMO), "--fps", "1", "--window", "3", "-t", "6", "-f", "jsonl"]
    reads, code, err = _reads(_caption(*clip, "-o", "-", "--partial", "--placement", "workers"))
    assert code == 0, err
    lines = [json.loads(line) for line in b"".join(reads).decode().splitlines()]
    plain = tmp_path / "plain.jsonl"
    done = subprocess.run(_caption(*clip, "-o", str(plain)), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    finals = [line for line in lines if "partial" not in line]
    assert "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in finals) == plain.read_text()
    assert [cue["index"] for cue in finals] == [1, 2]
    for cue in finals:
        at = lines.index(cue)
        texts = [line["text"] for line in lines[:at] if line.get("partial") and line["index"] == cue["index"]]
        assert len(texts) > 1 and texts[-1] == cue["text"]
        assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))
