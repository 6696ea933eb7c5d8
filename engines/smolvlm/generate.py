"""Token generation as small free functions over a static KV cache (after gpt-fast's generate.py).

``generate`` embeds the prompt (image embeddings merged in), runs ``prefill`` once, then
``decode_n_tokens`` feeds one token at a time through ``decode_one_token``. The cache lives on
the model (``model.cache``), is allocated on first use and only replaced when a request needs a
longer one (lengths rounded up to ``CACHE_STEP``), so a worker reuses it across windows.

Stopping matches transformers' ``generate``: greedy argmax (first index on ties); a stop id ends
the sequence. The reference's output keeps that final stop token, ours leaves it out; it is a
special token, so the decoded text (``skip_special_tokens=True``) is the same. With
``force_new_tokens`` the stop ids are masked to -inf like transformers' ``min_new_tokens``, so
exactly ``max_new_tokens`` tokens come back and they equal the reference's
``generate(min_new_tokens=max_new_tokens)``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ffai.errors import EngineError

from .model import Idefics3
from .text import KVCache

CACHE_STEP = 256


def ensure_cache(model: Idefics3, batch: int, length: int) -> KVCache:
    """The model's cache, replaced by a larger one only when ``length`` positions do not fit."""
    cache = model.cache
    if cache is None or not cache.fits(batch, length, model.dtype, model.device):
        limit = model.cfg.text.max_position_embeddings
        size = min(-(-length // CACHE_STEP) * CACHE_STEP, limit)
        model.cache = cache = model.text.new_cache(batch, max(size, length))
    return cache


def prefill(model: Idefics3, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """(B, T, D) prompt embeddings from position 0 -> (B, vocab) logits for the next token."""
    pos = torch.arange(x.shape[1], device=x.device)
    return model.text(x, pos, cache, last_only=True)[:, -1]


def decode_one_token(
    model: Idefics3, token: torch.Tensor, pos: int, cache: KVCache, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) token ids at position ``pos`` -> (B, vocab) logits for the token after.

    ``positions`` (an ``arange`` covering ``pos``) saves building a position tensor per step.
    """
    x = model.text.embed_tokens(token[:, None])  # (B, 1, D)
    pos_t = positions[pos : pos + 1] if positions is not None else torch.tensor([pos], device=x.device)
    return model.text(x, pos_t, cache)[:, -1]


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
    positions = torch.arange(pos + n, device=logits.device)  # every position this call can reach
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
        logits = decode_one_token(model, token, pos, cache, positions)
        pos += 1


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def sampler(temperature: float, top_k: int, top_p: float, generator: torch.Generator):
    """Temperature, then top-k, then nucleus (top-p) filtering; draws from ``generator``."""

    def pick(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float() / temperature
        if top_k > 0:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            drop = probs.cumsum(dim=-1) - probs >= top_p  # keep the smallest set reaching top_p
            logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = logits.softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    return pick


def _picker(temperature: float, top_p: float, top_k: int, seed: int | None, device) -> Callable:
    if temperature == 0:
        if top_p < 1.0 or top_k > 0:
            raise EngineError("top-p/top-k need a temperature > 0")
        return greedy
    if seed is None:
        raise EngineError("sampling needs a seed so runs are reproducible")
    generator = torch.Generator(device=device).manual_seed(seed)
    return sampler(temperature, top_k, top_p, generator)


@torch.no_grad()
def generate(
    model: Idefics3,
    input_ids: torch.Tensor | Sequence[int],
    image_embeds: torch.Tensor | None,
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    force_new_tokens: bool = False,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """New token ids for one prompt (stop token excluded); ``on_token`` sees each as it comes."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() > 2 or (ids.dim() == 2 and ids.shape[0] != 1):
        raise EngineError(f"generate takes one prompt, got input_ids of shape {tuple(ids.shape)}")
    ids = ids.reshape(1, -1)  # (1, T)
    if max_new_tokens < 1:
        raise EngineError("max_new_tokens must be at least 1")
    prompt_len = ids.shape[1]
    limit = model.cfg.text.max_position_embeddings
    if prompt_len + max_new_tokens > limit:
        raise EngineError(
            f"prompt of {prompt_len} tokens + {max_new_tokens} new tokens exceeds the model's context of {limit}"
        )
    pick = _picker(temperature, top_p, top_k, seed, model.device)
    x = model.embed(ids, image_embeds)  # (1, T, D)
    cache = ensure_cache(model, 1, prompt_len + max_new_tokens)
    logits = prefill(model, x, cache)
    return decode_n_tokens(
        model, logits, prompt_len, cache, max_new_tokens,
        pick=pick, stop_ids=stop_ids, force=force_new_tokens, on_token=on_token,
    )
