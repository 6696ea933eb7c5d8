"""Qwen3-VL's agreement probes for the bench (``ffai.bench.agreement``): what its stages compute on
the way to an answer, read from an ``InlineEngine`` of the qwen3-vl engine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ffai.engine import Request

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ffai.inline import InlineEngine


def text_weights(model_dir: Path) -> int:
    """How many weights the text tower (embedding table, layers, final norm) and the LM head hold,
    counted from config.json, as SmolVLM's probe counts them (a decode step reads one row of the
    embedding table, so this floor is the loose one)."""
    from ffai_qwen3vl.config import ModelConfig

    cfg = ModelConfig.from_dir(model_dir)
    t = cfg.text
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    attention = t.hidden_size * (q + 2 * kv) + q * t.hidden_size + 2 * t.head_dim  # q/k RMSNorm weights
    if t.attention_bias:
        attention += q + 2 * kv + t.hidden_size
    layer = attention + 3 * t.hidden_size * t.intermediate_size + 2 * t.hidden_size  # two RMSNorm weights
    embed = t.vocab_size * t.hidden_size
    head = 0 if cfg.tie_word_embeddings else t.vocab_size * t.hidden_size
    return embed + t.num_hidden_layers * layer + t.hidden_size + head


def _state(model: "InlineEngine", encoded):
    from ffai_qwen3vl.generate import prompt_state

    images, videos = (None, encoded.visual) if encoded.video else (encoded.visual, None)
    return prompt_state(model["text"].net, encoded.input_ids, images, videos)


def prefill_logits(model: "InlineEngine", encoded) -> "torch.Tensor":
    """(vocab,) the logits the prompt (visual tokens and DeepStack features merged in) gives for
    the first new token."""
    import torch

    from ffai_qwen3vl.generate import prefill

    net = model["text"].net
    with torch.inference_mode():
        ids, positions, _, (x, deepstack) = _state(model, encoded)
        return prefill(net, x, positions, net.text.reserve_cache(1, ids.shape[1]), deepstack)[0]


def features_and_logits(model: "InlineEngine", request: Request) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The vision tower's outputs as the agreement gate's tiles, and the (vocab,) prefill logits.

    A tile is one picture (a still, or a frame pair of a clip) in one output: the merged visual
    tokens, then each DeepStack feature, (tokens, D) each, stacked (4 x pictures, tokens, D), so
    every output the text tower takes is gated, each picture on its own as SmolVLM's tiles are."""
    import torch

    encoded = model.through(request, "vision")
    visual = encoded.visual
    counts = (visual.grid_thw.prod(-1) // model["vision"].net.cfg.vision.merge_unit).tolist()
    tiles = []
    for output in (visual.embeds, *visual.deepstack):
        for rows, frames in zip(output.split(counts), visual.grid_thw[:, 0].tolist()):
            tiles += list(rows.chunk(frames))
    if len({t.shape for t in tiles}) != 1:  # pictures of different sizes: one tile per output
        tiles = [visual.embeds, *visual.deepstack]
    return torch.stack(tiles), prefill_logits(model, encoded)


def timed_tokens(model: "InlineEngine", request: Request) -> tuple[list[int], float, list[float]]:
    """The tokens, the seconds to the first one, and the seconds between each token and the next.
    The visual tokens come first, untimed; the callback only takes the time (decoding each token
    to text would compete for the cores, as SmolVLM's probe explains)."""
    import torch

    from ffai_qwen3vl.generate import generate

    encoded = model.through(request, "vision")
    decoder = model["text"]
    images, videos = (None, encoded.visual) if encoded.video else (encoded.visual, None)
    stamps: list[float] = []
    start = time.perf_counter()
    with torch.inference_mode():
        tokens = generate(
            decoder.net,
            encoded.input_ids,
            images,
            videos,
            encoded.options,
            decoder.stop_ids,
            lambda _: stamps.append(time.perf_counter()),
        )
    return tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]
