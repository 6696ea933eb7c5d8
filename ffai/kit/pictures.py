"""Pictures as transformers' processors take them, for every engine's preprocessing: converted to
RGB as ``convert_to_rgb`` converts them, laid out as uint8 tensors, and resized as torchvision's
``resize`` resizes a uint8 picture on a CPU. An engine's geometry (sizes, tiles, grids) is its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ffai.errors import MediaError
from ffai.media import MAX_SIDE

if TYPE_CHECKING:  # pragma: no cover - typing only; torch and PIL load lazily
    import torch
    from PIL import Image

# Pillow's filter numbers (a processor config's ``resample``) -> interpolate's modes that have a
# uint8 kernel on a CPU, which torchvision's resize hands uint8 pictures to as they are.
TORCH_INTERPOLATION = {1: "lanczos", 3: "bicubic"}


def check_image_size(image: Image.Image, what: str = "image") -> None:
    """Refuse absurd inputs (library callers included) before anything is allocated for them."""
    width, height = image.size
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise MediaError(f"{what} of {width}x{height} pixels: each side must be 1..{MAX_SIDE}")


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB as the reference (``transformers.image_transforms.convert_to_rgb``) converts, mode for
    mode: anything with an "A" band or a ``transparency`` entry (P or L or RGB with tRNS, LA, PA,
    RGBA) is composited onto white; every other mode goes through Pillow's ``convert("RGB")``,
    which clips 16-bit and float samples to 0..255 rather than scaling them. A mode Pillow cannot
    convert (premultiplied "La"; the reference raises there too) is a MediaError."""
    from PIL import Image

    try:
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return image.convert("RGB")
    except ValueError as e:
        raise MediaError(f"cannot convert a {image.mode} image to RGB: {e}") from e


def rgb_tensor(image: Image.Image) -> torch.Tensor:
    """(1, 3, H, W) uint8, contiguous: the picture converted as ``to_rgb`` converts it, laid out as
    the torchvision processors lay out a picture before resizing it."""
    import torch

    rgb = to_rgb(image)
    x = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(1, rgb.height, rgb.width, 3)
    return x.permute(0, 3, 1, 2).contiguous()


def resize_tensor(x: torch.Tensor, size: tuple[int, int], resample: int) -> torch.Tensor:
    """(n, 3, h, w) uint8 -> (n, 3, *size), as torchvision's resize does it on a CPU (antialiased,
    no corner alignment, nothing done where the size is already right)."""
    import torch.nn.functional as F

    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=list(size), mode=TORCH_INTERPOLATION[resample], align_corners=False, antialias=True)
