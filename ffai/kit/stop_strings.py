"""Stop strings (``--stop``), for every engine: generation ends at the first token after which
the answer's decoded text holds one of them, and the answer is its text before the earliest
one. Checked on text, not tokens, so a stop string may span tokens, as transformers'
``StopStringCriteria`` checks it (that token is the last generated there too). Streamed text
never shows what a stop string cuts: the tail that could still begin one is held back."""

from __future__ import annotations

from typing import Callable, Sequence


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest of ``stops`` begins in ``text``; None when none is in it."""
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return min(found) if found else None


def cut(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the earliest of ``stops``; all of it when none is in it."""
    at = first_stop(text, stops)
    return text if at is None else text[:at]


def ended_by(stops: Sequence[str], decode: Callable[[Sequence[int]], str]) -> Callable[[list[int]], bool] | None:
    """For the token loop: whether the tokens so far decode to a text holding a stop string.
    None without stop strings (nothing to check)."""
    if not stops:
        return None
    return lambda tokens: first_stop(decode(tokens), stops) is not None


class StopFilter:
    """Streamed pieces of an answer in, the pieces of its text before the earliest stop string
    out: what could still begin a stop string is held until the next piece tells, and nothing
    after a stop string is given. The pieces given add up to ``cut`` of the whole text."""

    def __init__(self, stops: Sequence[str], on_text: Callable[[str], None]) -> None:
        self.stops, self.on_text = tuple(stops), on_text
        self.text = ""  # every piece so far
        self.shown = 0  # how much of it was given on
        self.stopped = False

    def __call__(self, piece: str) -> None:
        if self.stopped:
            return
        self.text += piece
        at = first_stop(self.text, self.stops)
        if at is not None:
            self.stopped = True
            self._show(at)
            return
        self._show(len(self.text) - self._held())

    def finish(self) -> None:
        """The end of the answer: what was held back could begin no stop string after all."""
        if not self.stopped:
            self._show(len(self.text))

    def _held(self) -> int:
        """The length of the longest end of the text that begins some stop string."""
        longest = max(map(len, self.stops), default=0)
        for n in range(min(len(self.text), longest - 1), 0, -1):
            if any(stop.startswith(self.text[-n:]) for stop in self.stops):
                return n
        return 0

    def _show(self, upto: int) -> None:
        if upto > self.shown:
            self.on_text(self.text[self.shown : upto])
            self.shown = upto
