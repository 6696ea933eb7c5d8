"""Token generation as small free functions over the text tower's static KV cache (after gpt-fast's
generate.py), for every engine.

An engine turns a request into a :class:`Prompt` (its embeddings with the pictures merged in, and
where its positions are not plain, their RoPE rows, an offset for the tokens after them, and
features to add after the first layers). ``generate`` runs ``prefill`` once, then
``decode_n_tokens`` feeds one token at a time through ``decode_one_token``. The cache is the
tower's own (``TextModel.reserve_cache``), so a worker reuses it across windows. The options come
validated (``DecodingOptions``); only what they cannot know is checked here: one prompt, whose
length with the new tokens fits the model's context.

Stopping matches transformers' ``generate``: greedy argmax (first index on ties), after the
repetition penalty where asked (``token_sampling.penalizer``); a stop id ends the sequence. The reference's output keeps that final stop token, ours leaves it out; it is a
special token, so the decoded text (``skip_special_tokens=True``) is the same. With
``force_new_tokens`` the stop ids are masked to -inf like transformers' ``min_new_tokens``, so
exactly ``max_new_tokens`` tokens come back and they equal the reference's
``generate(min_new_tokens=max_new_tokens)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ffai.errors import EngineError
from ffai.kit.token_sampling import Penalize, penalizer, picker

if TYPE_CHECKING:  # pragma: no cover
    from ffai.engines.contract import DecodingOptions
    from ffai.kit.text_tower import KVCache, TextModel


@dataclass(frozen=True)
class Prompt:
    """One prompt as the text tower takes it.

    ``embeds`` (1, T, D): the token embeddings with the pictures' in place. ``rope``: the (T,
    head_dim) cos and signed sin of its positions, or None for plain positions 0 .. T-1 (the
    tower's own table). ``delta``: where the positions are not plain, the token generated i-th
    sits at position T + i + delta. ``inject``: features added after the first layers
    (``TextModel.forward``). ``ids``: the prompt's token ids (those the repetition penalty
    counts as seen)."""

    embeds: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    delta: int = 0
    inject: tuple[torch.Tensor, list[torch.Tensor]] | None = None
    ids: torch.Tensor | None = None  # (T,) the prompt's token ids, for the repetition penalty

    @property
    def length(self) -> int:
        return self.embeds.shape[1]


def prefill(text: TextModel, prompt: Prompt, cache: KVCache | None) -> torch.Tensor:
    """The prompt from position 0 -> (1, vocab) logits for the next token."""
    n = prompt.length
    rope = prompt.rope if prompt.rope is not None else text.rope_rows(0, n)
    return text(prompt.embeds, rope, slice(0, n), cache, inject=prompt.inject, last_only=True)[:, -1]


def decode_one_token(text: TextModel, token: torch.Tensor, slot: int, position: int, cache: KVCache) -> torch.Tensor:
    """(B,) token ids written at cache ``slot``, at rotary ``position`` -> (B, vocab) logits."""
    x = text.embed(token[:, None])  # (B, 1, D)
    rope = text.rope_rows(position, position + 1)
    compiled = text.compiled_decode  # an opt-in dtype's compiled step, where asked for
    if compiled is not None and (logits := compiled(x, slot, rope, cache)) is not None:
        return logits
    return text(x, rope, slice(slot, slot + 1), cache)[:, -1]


def decode_n_tokens(
    text: TextModel,
    logits: torch.Tensor,
    slot: int,
    delta: int,
    cache: KVCache,
    n: int,
    *,
    pick: Callable[[torch.Tensor], torch.Tensor],
    stop_ids: Sequence[int],
    force: bool,
    on_token: Callable[[int], None] | None = None,
    penalize: Penalize | None = None,
    ended: Callable[[list[int]], bool] | None = None,
) -> list[int]:
    """Up to ``n`` tokens from the prefill's ``logits``; the next token goes in at cache ``slot``,
    at rotary position ``slot + delta``. ``ended(tokens)`` ends them after a token (stop strings:
    that token is kept)."""
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=logits.device)
    tokens: list[int] = []
    while True:
        if penalize is not None:
            logits = penalize(logits, tokens)
        if force and stops.numel():
            logits = logits.index_fill(-1, stops, float("-inf"))
        token = pick(logits)  # (B,)
        value = int(token[0])
        if not force and value in stop_ids:
            return tokens
        tokens.append(value)
        if on_token is not None:
            on_token(value)
        if len(tokens) == n or (ended is not None and ended(tokens)):
            return tokens
        logits = decode_one_token(text, token, slot, slot + delta, cache)
        slot += 1


@torch.no_grad()
def generate(
    text: TextModel,
    prompt: Prompt,
    options: DecodingOptions,
    stop_ids: Sequence[int],
    on_token: Callable[[int], None] | None = None,
    ended: Callable[[list[int]], bool] | None = None,
) -> list[int]:
    """New token ids for one prompt (stop token excluded); ``on_token`` sees each as it comes;
    ``ended`` as ``decode_n_tokens`` takes it."""
    if prompt.embeds.dim() != 3 or prompt.embeds.shape[0] != 1:
        raise EngineError(f"generate takes one prompt, got embeddings of shape {tuple(prompt.embeds.shape)}")
    n, limit = options.max_new_tokens, text.cfg.max_position_embeddings
    if prompt.length + n > limit:
        raise EngineError(f"prompt of {prompt.length} tokens + {n} new tokens exceeds the model's context of {limit}")
    pick = picker(options, text.device)
    cache = text.reserve_cache(1, prompt.length + n)
    logits = prefill(text, prompt, cache)
    return decode_n_tokens(
        text,
        logits,
        prompt.length,
        prompt.delta,
        cache,
        n,
        pick=pick,
        stop_ids=stop_ids,
        force=options.force_new_tokens,
        on_token=on_token,
        penalize=penalizer(options, prompt.ids),
        ended=ended,
    )
