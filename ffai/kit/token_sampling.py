"""How the next token is chosen from a step's logits, for every engine: greedy argmax (first index
on ties, as transformers' greedy search), or ``DecodingOptions``' temperature, top-k and top-p drawn
from a generator seeded once per answer; before either, the repetition penalty where asked. Imports
torch: only generation code uses it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

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


Penalize = Callable[[torch.Tensor, Sequence[int]], torch.Tensor]


def penalizer(options: DecodingOptions, prompt_ids: torch.Tensor | None) -> Penalize | None:
    """``options.repetition_penalty`` as transformers' ``RepetitionPenaltyLogitsProcessor`` applies
    it: (1, vocab) logits and the answer's tokens so far -> the logits with every token seen in
    the prompt (its ids, image placeholders included) or the answer divided by the penalty where
    positive, multiplied where negative. None when the penalty is off (1.0)."""
    penalty = options.repetition_penalty
    if penalty == 1.0:
        return None
    if prompt_ids is None:
        raise ValueError("a repetition penalty needs the prompt's token ids")
    seen = set(prompt_ids.reshape(-1).tolist())

    def penalize(logits: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
        seen.update(tokens)
        ids = torch.tensor(sorted(seen), dtype=torch.long, device=logits.device).expand(logits.shape[0], -1)
        score = logits.gather(-1, ids)
        return logits.scatter(-1, ids, torch.where(score < 0, score * penalty, score / penalty))

    return penalize
