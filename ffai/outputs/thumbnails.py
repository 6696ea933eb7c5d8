"""The thumbnails of a cue's frames: small JPEGs made where a window's frames are, then carried
on the cue (``ffai.outputs.cues.Thumbnail``), so no frame outlives its window. The contact sheet
(``ffai.outputs.sheet``) shows them; ``ffai.run.window_source`` makes them during a caption run,
``ffai.outputs.sheet_build`` again from a track's source.

Size: a thumbnail fits a ``THUMB_SIDE`` square and at most ``THUMB_MAX_BYTES`` (JPEG quality
steps down until it does), at most ``MAX_THUMBS`` per cue, so a cue adds at most about
``4 * 4/3 * THUMB_MAX_BYTES`` bytes (base64) to the page plus its text: a 10-minute clip at
``--fps 2 --window 8`` (150 cues) stays near 4 MB whatever it shows, and real footage, whose
thumbnails rarely reach the budget, well under it.
"""

from __future__ import annotations

import io
from typing import Sequence

from PIL import Image

from ffai.errors import MediaError
from ffai.outputs.cues import Thumbnail

MAX_THUMBS = 4  # per cue, spread over its window
THUMB_SIDE = 200  # px: a video thumbnail fits this square (200 wide for landscape frames)
STILL_SIDE = 480  # px: a still's one picture may be larger
THUMB_MAX_BYTES = 5_000  # per video thumbnail (JPEG): the page-size bound of the docstring
STILL_MAX_BYTES = 60_000
_QUALITIES = (75, 60, 45, 30, 20)


def thumbnail_indices(count: int) -> tuple[int, ...]:
    """Which of a window's ``count`` frames get a thumbnail: all of up to ``MAX_THUMBS``, else
    ``MAX_THUMBS`` spread evenly from the first to the last."""
    if count <= MAX_THUMBS:
        return tuple(range(count))
    return tuple(round(i * (count - 1) / (MAX_THUMBS - 1)) for i in range(MAX_THUMBS))


def _display_rgb(image: Image.Image) -> Image.Image:
    """RGB for showing: transparency over white, as the engine composites it for the model, so
    the thumbnail shows what the model saw; other modes through Pillow's own conversion."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def thumbnail(
    image: Image.Image, time_ms: int, *, side: int = THUMB_SIDE, max_bytes: int = THUMB_MAX_BYTES
) -> Thumbnail:
    """A JPEG of ``image`` fitting a ``side`` square (never enlarged), at most ``max_bytes``."""
    try:
        rgb = _display_rgb(image)
    except ValueError as e:  # a mode Pillow cannot convert; the model refuses it too
        raise MediaError(f"cannot convert a {image.mode} image to RGB: {e}") from e
    rgb.thumbnail((side, side), Image.Resampling.BICUBIC)
    while True:
        for quality in _QUALITIES:
            buffer = io.BytesIO()
            rgb.save(buffer, "JPEG", quality=quality, optimize=True)
            if buffer.tell() <= max_bytes:
                return Thumbnail(time_ms, rgb.width, rgb.height, buffer.getvalue())
        # Even the lowest quality is too large (noise-like pictures): smaller, and again.
        rgb = rgb.resize((max(1, rgb.width * 3 // 4), max(1, rgb.height * 3 // 4)), Image.Resampling.BICUBIC)


def window_thumbnails(frames: Sequence) -> tuple[Thumbnail, ...]:
    """Thumbnails of a window's frames (``ffai.media.Frame``: ``time`` in s, ``image``)."""
    return tuple(thumbnail(frames[i].image, round(frames[i].time * 1000)) for i in thumbnail_indices(len(frames)))


def still_thumbnail(image: Image.Image) -> Thumbnail:
    return thumbnail(image, 0, side=STILL_SIDE, max_bytes=STILL_MAX_BYTES)
