"""How the next token is chosen from a step's logits, for every engine: greedy argmax (first index
on ties, as transformers' greedy search), or ``DecodingOptions``' temperature, top-k and top-p drawn
from a generator seeded once per answer. Imports torch: only generation code uses it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:  # pragma: no cover
    from ffai.engines.contract import DecodingOptions


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
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]

    return pick


def picker(options: DecodingOptions, device) -> Callable[[torch.Tensor], torch.Tensor]:
    """(B, vocab) logits -> (B,) token ids, as ``options`` ask."""
    if options.temperature == 0:  # DecodingOptions allows no top-p/top-k then
        return greedy
    generator = torch.Generator(device=device).manual_seed(options.seed)
    return sampler(options.temperature, options.top_k, options.top_p, generator)
