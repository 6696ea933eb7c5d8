"""Several sequences decoded together, one step for all of them per token (continuous batching,
as vLLM and SGLang schedule it): a sequence joins between two steps, and leaves the moment it ends.

A decode step on a CPU is the read of the text tower's weights; one read serves every row of
:meth:`ffai.kit.text_tower.TextModel.decode_rows`. Each sequence keeps its own KV cache, sized by
its prompt and its ``max_new_tokens``, its own sampler and its own stop rule, exactly as
:func:`ffai.kit.generate.generate` runs one alone; and each row of a step is computed as it would
be alone (``ffai.kit.linears.linear``, ``ffai.kit.linears.several_sequences``), so a sequence's
tokens are the same whichever others share its steps (tests/test_batched_decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, Sequence

import torch

from ffai.engines.contract import NoRoomYet
from ffai.errors import EngineError
from ffai.kit.generate import Prompt, prefill
from ffai.kit.token_sampling import Penalize, penalizer, picker

if TYPE_CHECKING:  # pragma: no cover
    from ffai.engines.contract import DecodingOptions
    from ffai.kit.text_tower import KVCache, TextModel


@dataclass
class _Sequence:
    prompt: Prompt
    options: DecodingOptions
    cache: KVCache
    pick: Callable[[torch.Tensor], torch.Tensor]
    on_token: Callable[[int], None] | None
    slot: int  # the cache slot the next token is written at
    penalize: Penalize | None = None
    ended: Callable[[list[int]], bool] | None = None  # stop strings, as ``generate`` takes them
    tokens: list[int] = field(default_factory=list)
    pending: int | None = None  # the token to feed at the next step


# What a joining sequence must leave free besides its cache: room for the step's activations and
# for the pipeline's other windows, so a batch never pushes the machine into swap.
RESERVE_BYTES = 512 * 2**20


class DecodeBatch:
    """The sequences a text tower is decoding, stepped together.

    ``join`` prefills a sequence alone and picks its first token; ``step`` feeds every sequence's
    last token through one batched step and picks the next ones. Both return the sequences that
    ended (a stop id, or ``max_new_tokens`` tokens) with their tokens, stop id left out, as
    ``generate`` returns them. Caches of ended sequences are kept for later ones that fit. A
    sequence whose new cache would not fit in free memory (``ffai.kit.host.available_memory``)
    waits for one of the others to end (``NoRoomYet``); alone, it joins whatever is free."""

    def __init__(self, text: TextModel, stop_ids: Sequence[int]) -> None:
        self.text = text
        self.stop_ids = tuple(stop_ids)
        self._stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self._active: dict[Hashable, _Sequence] = {}
        self._spare: list[KVCache] = []

    def __len__(self) -> int:
        return len(self._active)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._active

    def join(
        self,
        key: Hashable,
        prompt: Prompt,
        options: DecodingOptions,
        on_token: Callable[[int], None] | None = None,
        ended: Callable[[list[int]], bool] | None = None,
    ) -> list[int] | None:
        """Start sequence ``key``: its tokens if it ends at its first, else None (it decodes on).
        ``ended`` as ``generate`` takes it."""
        if key in self._active:
            raise EngineError(f"sequence {key!r} is already being decoded")
        if prompt.embeds.dim() != 3 or prompt.embeds.shape[0] != 1:
            raise EngineError(f"a sequence takes one prompt, got embeddings of shape {tuple(prompt.embeds.shape)}")
        n, limit = options.max_new_tokens, self.text.cfg.max_position_embeddings
        if prompt.length + n > limit:
            raise EngineError(
                f"prompt of {prompt.length} tokens + {n} new tokens exceeds the model's context of {limit}"
            )
        cache = self._cache(prompt.length + n, room=bool(self._active))
        pick = picker(options, self.text.device)
        penalize = penalizer(options, prompt.ids)
        sequence = _Sequence(prompt, options, cache, pick, on_token, prompt.length, penalize, ended)
        try:
            logits = prefill(self.text, prompt, cache)
            ended = self._advance(sequence, logits)
        except BaseException:
            self._spare.append(cache)
            raise
        if ended:
            self._spare.append(cache)
            return sequence.tokens
        self._active[key] = sequence
        return None

    def step(self) -> list[tuple[Hashable, list[int]]]:
        """One token for every sequence; the sequences that ended, with their tokens."""
        if not self._active:
            return []
        keys = list(self._active)
        sequences = [self._active[k] for k in keys]
        tokens = torch.tensor([s.pending for s in sequences], dtype=torch.long, device=self.text.device)
        rows = [(s.cache, s.slot, s.slot + s.prompt.delta) for s in sequences]
        logits = self.text.decode_rows(tokens, rows)  # (B, vocab)
        ended = []
        for i, (key, sequence) in enumerate(zip(keys, sequences)):
            sequence.slot += 1
            if self._advance(sequence, logits[i : i + 1]):
                ended.append((key, self._leave(key)))
        return ended

    def drop(self, key: Hashable) -> None:
        """Stop decoding ``key`` (aborted, or failed elsewhere); nothing if it is not here."""
        if key in self._active:
            self._leave(key)

    def _advance(self, sequence: _Sequence, logits: torch.Tensor) -> bool:
        """Pick the next token from ``logits`` (1, vocab), as ``decode_n_tokens`` does; True when
        the sequence has ended."""
        force = sequence.options.force_new_tokens
        if sequence.penalize is not None:
            logits = sequence.penalize(logits, sequence.tokens)
        if force and self._stops.numel():
            logits = logits.index_fill(-1, self._stops.to(logits.device), float("-inf"))
        value = int(sequence.pick(logits)[0])
        if not force and value in self.stop_ids:
            return True
        sequence.tokens.append(value)
        if sequence.on_token is not None:
            sequence.on_token(value)
        if len(sequence.tokens) == sequence.options.max_new_tokens:
            return True
        if sequence.ended is not None and sequence.ended(sequence.tokens):
            return True
        sequence.pending = value
        return False

    def _leave(self, key: Hashable) -> list[int]:
        sequence = self._active.pop(key)
        self._spare.append(sequence.cache)
        return sequence.tokens

    def _cache(self, length: int, room: bool = False) -> KVCache:
        """A cache for ``length`` positions: the smallest spare one that fits, else a new one
        (rounded up as the tower rounds its own, so that later sequences fit it); with ``room``,
        ``NoRoomYet`` when a new one would not fit in free memory."""
        from ffai.kit import host
        from ffai.kit.text_tower import CACHE_STEP

        dtype = self.text.cache_dtype or self.text.dtype
        fits = [c for c in self._spare if c.fits(1, length, dtype, self.text.device)]
        if fits:
            cache = min(fits, key=lambda c: c.max_len)
            self._spare.remove(cache)
            return cache
        size = max(min(-(-length // CACHE_STEP) * CACHE_STEP, self.text.cfg.max_position_embeddings), length)
        if room:
            free = host.available_memory(str(self.text.device))
            if free is not None and free < self.text.cache_bytes(1, size) + RESERVE_BYTES:
                raise NoRoomYet(f"a cache of {size} positions does not fit in free memory")
        return self.text.new_cache(1, size)

    def release(self) -> None:
        """Free the spare caches (the active ones stay)."""
        self._spare.clear()
