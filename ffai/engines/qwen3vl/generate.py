"""Token generation as small free functions over a static KV cache (after gpt-fast's generate.py).

``generate`` embeds the prompt (visual tokens merged in), runs ``prefill`` once at the prompt's
multimodal positions, then ``decode_n_tokens`` feeds one token at a time through
``decode_one_token``. Token i after the prompt sits at cache slot ``prompt length + i`` and at
rotary position ``prompt length + i + delta`` on all three rows, as transformers places it.

Stopping matches transformers' ``generate``: greedy argmax (first index on ties); a stop id
(``prompt.stop_ids``: generation_config.json's eos ids) ends the sequence and is left out of the
answer. With ``force_new_tokens`` the stop ids are masked to -inf like transformers'
``min_new_tokens``, so exactly ``max_new_tokens`` tokens come back, equal to the reference's
``generate(min_new_tokens=max_new_tokens)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ffai.errors import EngineError
from ffai.kit.token_sampling import picker

from .model import Qwen3VL, Visual
from .rope import inv_freq, mrope_angles, rotary
from .text import KVCache

if TYPE_CHECKING:  # pragma: no cover
    from ffai.engines.contract import DecodingOptions


def rope_rows(model: Qwen3VL, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, T) positions -> cos and signed sin, (T, head_dim) each, for the text tower."""
    cfg = model.cfg.text
    freqs = inv_freq(cfg.head_dim, cfg.rope_theta, positions.device)
    return rotary(mrope_angles(positions, freqs, cfg.mrope_section), dtype)


def prefill(
    model: Qwen3VL,
    x: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache,
    deepstack: tuple[torch.Tensor, list[torch.Tensor]] | None,
) -> torch.Tensor:
    """(1, T, D) prompt embeddings at (3, 1, T) positions -> (1, vocab) logits for the next token."""
    rope = rope_rows(model, positions[:, 0].to(x.device), x.dtype)
    return model.text(x, rope, slice(0, x.shape[1]), cache, deepstack=deepstack, last_only=True)[:, -1]


def decode_one_token(
    model: Qwen3VL, token: torch.Tensor, slot: int, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache
) -> torch.Tensor:
    """(B,) token ids written at cache ``slot`` with its (1, head_dim) ``rope`` -> (B, vocab) logits."""
    x = model.text.embed(token[:, None])  # (B, 1, D)
    return model.text(x, rope, slice(slot, slot + 1), cache)[:, -1]


def decode_n_tokens(
    model: Qwen3VL,
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
) -> list[int]:
    """Up to ``n`` tokens from the prefill's ``logits``; the next token goes in at cache ``slot``."""
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=logits.device)
    # Every position this call can reach, rotated once rather than once per step.
    positions = (torch.arange(slot, slot + n, device=logits.device) + delta).expand(3, -1)  # (3, n)
    cos, sin = rope_rows(model, positions, model.text.dtype)  # (n, hd) each
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
        i = len(tokens) - 1
        logits = decode_one_token(model, token, slot + i, (cos[i : i + 1], sin[i : i + 1]), cache)


@torch.no_grad()
def prompt_state(
    model: Qwen3VL, input_ids: torch.Tensor | Sequence[int], images: Visual | None, videos: Visual | None
) -> tuple[torch.Tensor, torch.Tensor, int, tuple | None]:
    """One prompt -> ((1, T) ids, (3, 1, T) positions, rope delta, embeddings and DeepStack input)."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() > 2 or (ids.dim() == 2 and ids.shape[0] != 1):
        raise EngineError(f"generate takes one prompt, got input_ids of shape {tuple(ids.shape)}")
    ids = ids.reshape(1, -1)  # (1, T)
    positions, delta = model.positions(ids, images, videos)
    return ids, positions, delta, model.embed(ids, images, videos)


@torch.no_grad()
def generate(
    model: Qwen3VL,
    input_ids: torch.Tensor | Sequence[int],
    images: Visual | None,
    videos: Visual | None,
    options: DecodingOptions,
    stop_ids: Sequence[int],
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """New token ids for one prompt (stop token excluded); ``on_token`` sees each as it comes."""
    ids, positions, delta, (x, deepstack) = prompt_state(model, input_ids, images, videos)
    prompt_len, n = ids.shape[1], options.max_new_tokens
    limit = model.cfg.text.max_position_embeddings
    if prompt_len + n > limit:
        raise EngineError(f"prompt of {prompt_len} tokens + {n} new tokens exceeds the model's context of {limit}")
    pick = picker(options, model.device)
    cache = model.text.reserve_cache(1, prompt_len + n)
    logits = prefill(model, x, positions, cache, deepstack)
    return decode_n_tokens(
        model,
        logits,
        prompt_len,
        delta,
        cache,
        n,
        pick=pick,
        stop_ids=stop_ids,
        force=options.force_new_tokens,
        on_token=on_token,
    )
