"""Token generation as small free functions over a static KV cache (after gpt-fast's generate.py).

``generate`` embeds the prompt (image embeddings merged in), runs ``prefill`` once, then
``decode_n_tokens`` feeds one token at a time through ``decode_one_token``. The cache is the
text tower's own (``TextModel.reserve_cache``), so a worker reuses it across windows. The
options come validated (``DecodingOptions``); only what they cannot know is checked here: one
prompt, whose length with the new tokens fits the model's context.

Stopping matches transformers' ``generate``: greedy argmax (first index on ties); a stop id ends
the sequence. The reference's output keeps that final stop token, ours leaves it out; it is a
special token, so the decoded text (``skip_special_tokens=True``) is the same. With
``force_new_tokens`` the stop ids are masked to -inf like transformers' ``min_new_tokens``, so
exactly ``max_new_tokens`` tokens come back and they equal the reference's
``generate(min_new_tokens=max_new_tokens)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ffai.errors import EngineError
from ffai.kit.token_sampling import picker

from .model import Idefics3
from .text import KVCache

if TYPE_CHECKING:  # pragma: no cover
    from ffai.engines.contract import DecodingOptions


def prefill(model: Idefics3, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """(B, T, D) prompt embeddings from position 0 -> (B, vocab) logits for the next token."""
    pos = torch.arange(x.shape[1], device=x.device)
    return model.text(x, pos, cache, last_only=True)[:, -1]


def decode_one_token(model: Idefics3, token: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """(B,) token ids at position ``pos`` (a (1,) tensor) -> (B, vocab) logits for the token after."""
    x = model.text.embed_tokens(token[:, None])  # (B, 1, D)
    compiled = model.text.compiled_decode  # int8's compiled step (compiled_decode.py), where asked for
    if compiled is not None and (logits := compiled(x, pos, cache)) is not None:
        return logits
    return model.text(x, pos, cache)[:, -1]


def decode_n_tokens(
    model: Idefics3,
    logits: torch.Tensor,
    pos: int,
    cache: KVCache,
    n: int,
    *,
    pick: Callable[[torch.Tensor], torch.Tensor],
    stop_ids: Sequence[int],
    force: bool,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """Up to ``n`` tokens from the prefill's ``logits``; the next token goes in at ``pos``."""
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=logits.device)
    # Every position this call can reach, built once rather than one tensor per step.
    positions = torch.arange(pos + n, device=logits.device)
    tokens: list[int] = []
    while True:
        if force and stops.numel():
            logits = logits.index_fill(-1, stops, float("-inf"))
        token = pick(logits)  # (B,)
        value = int(token[0])
        if not force and value in stop_ids:
            return tokens
        tokens.append(value)
        if on_token is not None:
            on_token(value)
        if len(tokens) == n:
            return tokens
        logits = decode_one_token(model, token, positions[pos : pos + 1], cache)
        pos += 1


@torch.no_grad()
def generate(
    model: Idefics3,
    input_ids: torch.Tensor | Sequence[int],
    image_embeds: torch.Tensor | None,
    options: DecodingOptions,
    stop_ids: Sequence[int],
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """New token ids for one prompt (stop token excluded); ``on_token`` sees each as it comes."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() > 2 or (ids.dim() == 2 and ids.shape[0] != 1):
        raise EngineError(f"generate takes one prompt, got input_ids of shape {tuple(ids.shape)}")
    ids = ids.reshape(1, -1)  # (1, T)
    prompt_len, n = ids.shape[1], options.max_new_tokens
    limit = model.cfg.text.max_position_embeddings
    if prompt_len + n > limit:
        raise EngineError(f"prompt of {prompt_len} tokens + {n} new tokens exceeds the model's context of {limit}")
    pick = picker(options, model.device)
    x = model.embed(ids, image_embeds)  # (1, T, D)
    cache = model.text.reserve_cache(1, prompt_len + n)
    logits = prefill(model, x, cache)
    return decode_n_tokens(
        model,
        logits,
        prompt_len,
        cache,
        n,
        pick=pick,
        stop_ids=stop_ids,
        force=options.force_new_tokens,
        on_token=on_token,
    )
