"""The kit's text tower and token loop called as the tests call them: a whole sequence or a chunk
of it at plain positions, and one prompt's generation from an engine model's ``prompt_of``."""

from __future__ import annotations

from ffai.kit.generate import generate


def tower(text, x, start: int = 0, cache=None):
    """``text`` (a ``ffai.kit.text_tower.TextModel``) over (1, T, D) ``x`` at plain positions
    [start, start + T): (1, T, vocab) logits, written into ``cache`` where one is given."""
    end = start + x.shape[1]
    return text(x, text.rope_rows(start, end), slice(start, end), cache)


def generate_from(model, *prompt, options, stop_ids, on_token=None) -> list[int]:
    """Generation for ``model.prompt_of(*prompt)`` (an engine model's prompt from its ids and
    visual input), through the kit's ``generate``."""
    return generate(model.text, model.prompt_of(*prompt), options, stop_ids, on_token)
