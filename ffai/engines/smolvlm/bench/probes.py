"""SmolVLM's agreement probes for the bench's precision run (``ffai.bench.agreement``): what its
stages compute on the way to an answer, read from an ``InlineEngine`` of the SmolVLM engine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ffai.engines.contract import Request

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ffai.run.inline import InlineEngine


def text_weights(model_dir: Path) -> int:
    """How many weights the text tower (embedding table, layers, final norm) and the LM head hold,
    counted from config.json (an int8 model's packed weights are no ``nn.Parameter`` to count).
    As the issue counts it, the text tower includes its embedding table, of which a decode step
    reads one row only, so the floor is the issue's (~163 MB for int8 on SmolVLM-256M), not a
    tighter one."""
    from ffai.engines.smolvlm.config import ModelConfig

    cfg = ModelConfig.from_dir(model_dir)
    t = cfg.text
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    attention = t.hidden_size * (q + 2 * kv) + q * t.hidden_size
    if t.attention_bias:
        attention += q + 2 * kv + t.hidden_size
    mlp = 3 * t.hidden_size * t.intermediate_size
    if t.mlp_bias:
        mlp += 2 * t.intermediate_size + t.hidden_size
    layer = attention + mlp + 2 * t.hidden_size  # two RMSNorm weights
    embed = t.vocab_size * t.hidden_size
    head = 0 if cfg.tie_word_embeddings else t.vocab_size * t.hidden_size
    return embed + t.num_hidden_layers * layer + t.hidden_size + head


def prefill_logits(model: "InlineEngine", encoded) -> "torch.Tensor":
    """(vocab,) the logits the prompt (image embeddings merged in) gives for the first new token."""
    import torch

    from ffai.engines.smolvlm.generate import prefill

    net = model["text"].net
    ids = torch.tensor([encoded.input_ids], device=net.device)  # (1, T)
    with torch.inference_mode():
        x = net.embed(ids, encoded.image_embeds)  # (1, T, D)
        return prefill(net, x, net.text.reserve_cache(1, ids.shape[1]))[0]


def features_and_logits(model: "InlineEngine", request: Request) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(n_tiles, image_seq_len, D) the vision tower + connector output of every tile, and the
    (vocab,) prefill logits."""
    encoded = model.through(request, "vision")
    return encoded.image_embeds, prefill_logits(model, encoded)


def timed_tokens(model: "InlineEngine", request: Request) -> tuple[list[int], float, list[float]]:
    """The tokens, the seconds to the first one, and the seconds between each token and the next.

    The image embeddings come first, untimed. Then the engine's own ``generate`` with a callback
    that only takes the time: the text stage's ``on_token`` decodes each token to text, and the
    tokenizer's thread pool then spins on the cores the decode step needs (on 2 cores a 1 ms step
    of the tiny model took 64 ms)."""
    import torch

    from ffai.engines.smolvlm.generate import generate

    encoded = model.through(request, "vision")
    stamps: list[float] = []
    decoder = model["text"]
    ids = torch.tensor([encoded.input_ids], device=decoder.net.device)  # (1, T)
    start = time.perf_counter()
    with torch.inference_mode():
        tokens = generate(
            decoder.net,
            ids,
            encoded.image_embeds,
            encoded.options,
            decoder.stop_ids,
            lambda _: stamps.append(time.perf_counter()),
        )
    return tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])]
