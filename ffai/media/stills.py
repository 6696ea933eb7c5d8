"""Still images by Pillow: a file's content is tried as an image first (Pillow reads only the
header), upright by its EXIF orientation and in the mode Pillow read it; animated GIF, APNG and
WebP files are timed here frame by frame, as video (``ffai.media``)."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from ffai.errors import MediaError
from ffai.media.sources import MediaInfo, check_size

_EXIF_SWAPS_AXES = {5, 6, 7, 8}  # orientations that transpose the image


def still_info(file: Path, image: Image.Image) -> MediaInfo:
    """What probing `file` gives when Pillow opened it as `image`: a still, or an animation's
    frames as video."""
    width, height = check_size(file, *image.size)
    if exif_orientation(file, image) in _EXIF_SWAPS_AXES:
        width, height = height, width
    verify(file)
    if is_animated(file, image):
        return MediaInfo(file, "video", width, height, animation_duration(file, image))
    return MediaInfo(file, "image", width, height, None)


def load_image(file: Path) -> Image.Image:
    """The still image `file` (checked: ``check_file``), upright (EXIF orientation applied), in
    the mode it was read: no colour conversion, so transparency, palettes and 16-bit or float
    samples reach the engine."""
    with open_still(file) as image:
        if image is None:
            raise MediaError(f"{file}: not an image")
        check_size(file, *image.size)
        try:
            image.load()
            # A copy either way, so the image outlives the file closed below.
            return ImageOps.exif_transpose(image)
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            raise MediaError(f"{file}: cannot decode image: {e}") from e


@contextmanager
def open_still(file: Path) -> Iterator[Image.Image | None]:
    """Pillow's lazy image for `file`, or None when Pillow does not recognise the content."""
    try:
        with warnings.catch_warnings():
            # Our own MAX_SIDE bound applies; Pillow's hard bomb limit still raises below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(file)
    except UnidentifiedImageError:
        image = None
    except Image.DecompressionBombError as e:
        raise MediaError(f"{file}: image too large: {e}") from e
    except OSError as e:
        raise MediaError(f"{file}: cannot read: {e.strerror or e}") from e
    except (ValueError, SyntaxError, EOFError) as e:  # a plugin that recognised the file, then choked on it
        raise MediaError(f"{file}: corrupt image: {e}") from e
    # Pillow identifies MPEG video headers but cannot decode them: leave those to PyAV.
    if image is not None and image.format == "MPEG":
        image.close()
        image = None
    try:
        yield image
    finally:
        if image is not None:
            image.close()


def exif_orientation(file: Path, image: Image.Image) -> int:
    try:
        # JPEG and WebP keep EXIF in the header; PNG may put it after the pixels, so Pillow
        # decodes a PNG here.
        exif = image.getexif()
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise MediaError(f"{file}: corrupt image: {e}") from e
    orientation = exif.get(ExifTags.Base.Orientation, 1)
    return orientation if isinstance(orientation, int) else 1


def verify(file: Path) -> None:
    """Pillow's structural check (PNG: chunk CRCs); it needs a freshly opened image."""
    try:
        with Image.open(file) as image:
            image.verify()
    except Exception as e:  # Pillow raises many types for a corrupt file
        raise MediaError(f"{file}: corrupt image: {e}") from e


# A frame that claims under this long (a GIF delay of 0 or 1 hundredth, common in files made
# without one) is shown for _DEFAULT_FRAME_MS, as FFmpeg's GIF demuxer and browsers show it.
_MIN_FRAME_MS = 20
_DEFAULT_FRAME_MS = 100


def is_animated(file: Path, image: Image.Image) -> bool:
    """More than one frame: an animated GIF, APNG or WebP (Pillow counts them from the headers)."""
    try:
        return getattr(image, "n_frames", 1) > 1
    except Exception as e:  # Pillow raises many types for a corrupt file (IndexError too)
        raise MediaError(f"{file}: corrupt image: {e}") from e


def frame_ms(image: Image.Image) -> float:
    """How long the frame `image` is seeked to is shown, in milliseconds (Pillow's ``duration``;
    WebP knows it only once the frame is decoded)."""
    if image.info.get("duration") is None:
        image.load()
    ms = image.info.get("duration") or 0
    return ms if ms >= _MIN_FRAME_MS else _DEFAULT_FRAME_MS


def animation(file: Path, image: Image.Image, *, decode: bool = True) -> Iterator[tuple[float, Image.Image]]:
    """(time, `image` seeked to the frame) for each frame of an animation, a frame's time the
    durations of those before it (summed in ms, so times are as exact as the file's). The image
    is the same object each time, a whole picture (Pillow applies each frame's disposal and
    blending): take what is needed before the next. ``decode=False`` reads only what timing
    needs."""
    elapsed_ms = 0.0
    for index in itertools.count():
        try:
            image.seek(index)
            if decode:
                image.load()
            ms = frame_ms(image)
        except EOFError:
            return
        except Exception as e:  # as is_animated
            raise MediaError(f"{file}: cannot decode frame {index + 1}: {e}") from e
        yield elapsed_ms / 1000, image
        elapsed_ms += ms


def animation_duration(file: Path, image: Image.Image) -> float:
    """Seconds from the first frame to the end of the last."""
    return sum(frame_ms(frame) for _, frame in animation(file, image, decode=False)) / 1000


def opaque(image: Image.Image) -> Image.Image:
    """RGB8: transparency composited onto white, as the engine converts a still (its reference's
    ``convert_to_rgb``), so a frame reaches the model as the same picture would as a still."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")
