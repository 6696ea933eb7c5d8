"""Requests as the tests build them: a still, or frames one second apart."""

from __future__ import annotations

from typing import Sequence

from ffai.engines.contract import DecodingOptions, Request


def request(images: Sequence, options: DecodingOptions, *, still: bool) -> Request:
    """A still (one image, tiled by the engine) or a window of frames at 0, 1, 2 ... seconds."""
    if still:
        return Request(tuple(images), options)
    return Request.frames(images, [float(i) for i in range(len(images))], options)
