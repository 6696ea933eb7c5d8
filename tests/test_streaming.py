"""Answers stream: the engine's incremental decoding, the pipeline carrying the pieces, their
trimming to the cue's text, and the tracks that show them (txt of a still on stdout, jsonl
``--partial``); through the real CLI in a subprocess, read as it writes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ffai.pipeline import Coordinator
from ffai.streaming import StrippedPieces
from ffai_smolvlm.prompt import PromptBuilder
from pipeline import toy_stages as toy

DEMO = Path(__file__).resolve().parents[1] / "models" / "smolvlm-demo"


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
