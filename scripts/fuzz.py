"""Seeded mutation fuzzing of ffai's front door: damaged copies of every kind of sample the
suite makes, for the fuzz tests (``tests/test_fuzz_media.py``) and ``scripts/fuzz_media.py``.

A case is a sample name and a recipe, a tuple of explicit operations on the sample's bytes::

    ("flip", offset, bit)                 # one bit flipped
    ("run", offset, length, byte)         # a run of one byte value written over the data
    ("truncate", length)                  # the file cut after `length` bytes
    ("splice", source, length, target)    # a range copied over another place in the file
    ("int", offset, fmt, value)           # a struct-packed integer written into a header field

Recipes are drawn from ``random.Random(f"{sample}:{seed}")``, so a seed names the same file
on every run; a file a run finds is kept as its recipe (``REGRESSIONS``), never as bytes.
Header damage aims at structure: offsets near the tags each format keeps its sizes, counts and
durations behind (MP4 boxes, Matroska elements, PNG chunks, JPEG markers ...) and at the
first bytes of the file.

``check(path)`` runs one file through probing and sampling in this process, as ffai's decoder
child runs it (``check(path, media.Decoder())``: in decoder children): a caption-worthy file gives its frames, a damaged one a ``MediaError``; anything
else (another exception, a crash) is a finding.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
from PIL import Image

import sample_media
from ffai import media
from ffai.errors import MediaError

Op = tuple
Recipe = tuple[Op, ...]

# Sampling as the fuzz CLI runs it: ``--fps 1 --max-frames 4``.
FPS = 1.0
MAX_FRAMES = 4


# ---------------------------------------------------------------------------- samples


def _still_pixels(width: int = 48, height: int = 32) -> np.ndarray:
    """A gradient with a few hard edges, so every codec has real work to do."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x ^ y) * 8 % 256], axis=-1)
    return rgb.astype(np.uint8)


def _save(image: Image.Image, path: Path, **kwargs) -> Path:
    image.save(path, **kwargs)
    return path


def _png_palette_trns(path: Path) -> Path:
    image = Image.fromarray(_still_pixels()).quantize(16)
    return _save(image, path, transparency=bytes(range(0, 256, 16)))


def _png_16bit(path: Path) -> Path:
    ramp = (np.arange(48 * 32, dtype=np.uint32).reshape(32, 48) * 42).astype(np.uint16)
    return _save(Image.fromarray(ramp), path)


def _jpeg_exif(path: Path) -> Path:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: probing swaps the axes
    return _save(Image.fromarray(_still_pixels()), path, exif=exif, quality=90)


def _animated(path: Path, **kwargs) -> Path:
    frames = [Image.fromarray(np.roll(_still_pixels(), 8 * i, axis=1)) for i in range(3)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, **kwargs)
    return path


def _rgb(mode: str = "RGB") -> Image.Image:
    return Image.fromarray(_still_pixels()).convert(mode)


STILLS: dict[str, Callable[[Path], Path]] = {
    "png_rgb.png": lambda p: _save(_rgb(), p),
    "png_rgba.png": lambda p: _save(_rgb("RGBA"), p),
    "png_la.png": lambda p: _save(_rgb("LA"), p),
    "png_p_trns.png": _png_palette_trns,
    "png_16bit.png": _png_16bit,
    "jpeg_rgb.jpg": lambda p: _save(_rgb(), p, quality=90),
    "jpeg_cmyk.jpg": lambda p: _save(_rgb("CMYK"), p, quality=90),
    "jpeg_exif.jpg": _jpeg_exif,
    "jpeg_progressive.jpg": lambda p: _save(_rgb(), p, quality=90, progressive=True),
    "gif_animated.gif": _animated,
    "webp_lossy.webp": lambda p: _save(_rgb(), p, quality=80),
    "webp_animated.webp": lambda p: _animated(p, lossless=True),
    "tiff_rgb.tiff": lambda p: _save(_rgb(), p, compression="tiff_lzw"),
    "tiff_float.tiff": lambda p: _save(Image.fromarray(_still_pixels()[..., 0].astype(np.float32) / 255, "F"), p),
    "bmp_rgb.bmp": lambda p: _save(_rgb(), p),
}


def _bitexact(path: Path) -> Path:
    """`path` remuxed in place without what Matroska makes differ run to run (the muxing date,
    random segment and track UIDs), so that a seed names the same bytes on every run."""
    remuxed = path.with_name("bitexact-" + path.name)
    with av.open(str(path)) as source, av.open(str(remuxed), "w", options={"fflags": "+bitexact"}) as target:
        streams = {s.index: target.add_stream_from_template(s) for s in source.streams}
        for packet in source.demux():
            if packet.size:  # not the end-of-stream packets demux() adds
                packet.stream = streams[packet.stream.index]
                target.mux(packet)
    remuxed.replace(path)
    return path


def _clip(codec: str | None = None) -> Callable[[Path], Path]:
    # One encoder thread: libx264's output differs from run to run with several.
    def make(path: Path) -> Path:
        path = sample_media.make_clip(path, 1.2, 10, codec=codec, options={"threads": "1"})
        return _bitexact(path) if path.suffix in (".mkv", ".webm") else path

    return make


VIDEOS: dict[str, Callable[[Path], Path]] = {
    "mp4_default.mp4": _clip(),
    "mp4_mpeg4.mp4": _clip("mpeg4"),
    "mov.mov": _clip(),
    "mkv.mkv": _clip(),
    "avi.avi": _clip(),
    "ts.ts": _clip(),
    "mp4_vfr.mp4": lambda p: sample_media.make_vfr_clip(p, sample_media.VFR_GAPS_MS[:8]),
    "mp4_odd.mp4": lambda p: sample_media.make_odd_size_clip(p, 0.5, (35, 27)),
    "mp4_rotated.mp4": lambda p: sample_media.make_rotated_clip(p, 90, 0.5),
    "video_10bit.mp4": lambda p: sample_media.make_10bit_clip(p, 0.5),
    "mkv_zero_frames.mkv": lambda p: _bitexact(sample_media.make_zero_frame_clip(p)),
    "mp4_audio_only.mp4": lambda p: sample_media.make_audio_only(p, 0.3),
    "mp4_cut_faststart.mp4": lambda p: sample_media.make_truncated_mp4(p, 3.0, faststart=True),
}
if media.encoder_available("libvpx-vp9"):
    VIDEOS["webm_vp9.webm"] = _clip("libvpx-vp9")

SAMPLES = {**STILLS, **VIDEOS}
# Image files of several frames among STILLS: ffai reads them as video (ffai.media).
ANIMATED = ("gif_animated.gif", "webp_animated.webp")


def sample_name(filename: str) -> str:
    return filename.rsplit(".", 1)[0]


def make_samples(folder: str | Path) -> dict[str, Path]:
    """Every sample (unmutated), by name, written into `folder` (a sample maker may pick its
    own suffix: the 10-bit clip is .mkv where libx264 has no 10-bit)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return {sample_name(name): Path(make(out / name)) for name, make in SAMPLES.items()}


# ---------------------------------------------------------------------------- mutations

# Where formats keep sizes, counts, offsets and durations: header damage lands near these.
TAGS = (
    # MP4 / MOV boxes
    *(b"ftyp", b"moov", b"mvhd", b"trak", b"tkhd", b"mdia", b"mdhd", b"hdlr", b"minf", b"stbl"),
    *(b"stsd", b"avc1", b"avcC", b"mp4v", b"esds", b"stts", b"stss", b"ctts", b"stsc", b"stsz"),
    *(b"stco", b"co64", b"elst", b"sdtp", b"mdat", b"sgpd", b"sbgp", b"hvcC", b"vpcC"),
    # Matroska / WebM element IDs (EBML, Segment, Info, Tracks, Cluster, Cues, TimecodeScale,
    # PixelWidth/Height with the Video element, CodecPrivate)
    *(b"\x1a\x45\xdf\xa3", b"\x18\x53\x80\x67", b"\x15\x49\xa9\x66", b"\x16\x54\xae\x6b"),
    *(b"\x1f\x43\xb6\x75", b"\x1c\x53\xbb\x6b", b"\x2a\xd7\xb1", b"\xe0", b"\x63\xa2"),
    # AVI chunks
    *(b"RIFF", b"hdrl", b"avih", b"strh", b"strf", b"movi", b"idx1", b"00dc"),
    # PNG chunks
    *(b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND", b"eXIf", b"acTL", b"fcTL"),
    # JPEG markers: SOF0, SOF2, DHT, DQT, SOS, APP1
    *(b"\xff\xc0", b"\xff\xc2", b"\xff\xc4", b"\xff\xdb", b"\xff\xda", b"\xff\xe1", b"\xff\xee"),
    # GIF, WebP, TIFF, BMP
    *(b"GIF89a", b"NETSCAPE", b"\x21\xf9\x04", b"WEBP", b"VP8 ", b"VP8L", b"VP8X", b"ANIM", b"ANMF"),
    *(b"II*\x00", b"MM\x00*", b"BM"),
    # H.264 parameter sets in Annex B streams (TS, AVI): SPS, PPS
    *(b"\x00\x00\x01\x67", b"\x00\x00\x01\x68", b"\x00\x00\x01\x65"),
)

INT_FORMATS = (">B", ">H", "<H", ">I", "<I", ">Q", "<Q")
INTERESTING = (
    *(0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x100000, 0x1000000),
    *(0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0x40000000, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF),
)
KINDS = ("flip", "run", "truncate", "splice", "int")


def tag_offsets(data: bytes) -> list[int]:
    """Every offset in `data` where one of TAGS starts (bounded per tag, for large files)."""
    found = []
    for tag in TAGS:
        start = 0
        for _ in range(64):
            at = data.find(tag, start)
            if at < 0:
                break
            found.append(at)
            start = at + 1
    return sorted(found)


def _draw_op(kind: str, data: bytes, tags: list[int], rng: random.Random) -> Op:
    size = len(data)
    if kind == "flip":
        return ("flip", rng.randrange(size), rng.randrange(8))
    if kind == "run":
        length = rng.choice((1, 2, 4, 8, 16, 64, 256, 1024))
        byte = rng.choice((0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        return ("run", rng.randrange(size), length, byte)
    if kind == "truncate":
        # Short cuts hit headers, long ones the last packets and trailing indexes.
        return ("truncate", rng.choice((rng.randrange(1, min(size, 128)), rng.randrange(1, size))))
    if kind == "splice":
        length = rng.choice((4, 16, 64, 256, 1024, rng.randrange(1, size)))
        return ("splice", rng.randrange(size), length, rng.randrange(size))
    fmt = rng.choice(INT_FORMATS)
    limit = 1 << (8 * struct.calcsize(fmt))
    value = rng.choice((*INTERESTING, rng.randrange(limit))) % limit
    if tags and rng.random() < 0.8:
        offset = max(0, rng.choice(tags) + rng.randrange(-8, 40))
    else:
        offset = rng.randrange(min(size, 64))
    return ("int", min(offset, size - 1), fmt, value)


def draw_recipe(sample: str, data: bytes, seed: int) -> Recipe:
    """The recipe seed `seed` names for `sample` (whose unmutated bytes are `data`): one to
    three operations, each of a kind drawn evenly from KINDS."""
    rng = random.Random(f"{sample}:{seed}")
    tags = tag_offsets(data)
    count = rng.choice((1, 1, 1, 2, 3))
    return tuple(_draw_op(rng.choice(KINDS), data, tags, rng) for _ in range(count))


def mutate(data: bytes, recipe: Recipe) -> bytes:
    """`data` with the recipe's operations applied in order."""
    out = bytearray(data)
    for op in recipe:
        kind, args = op[0], op[1:]
        if not out:
            break
        if kind == "flip":
            offset, bit = args
            out[offset % len(out)] ^= 1 << bit
        elif kind == "run":
            offset, length, byte = args
            offset %= len(out)
            end = min(len(out), offset + length)
            out[offset:end] = bytes([byte]) * (end - offset)
        elif kind == "truncate":
            del out[max(1, args[0]) :]
        elif kind == "splice":
            source, length, target = args
            chunk = bytes(out[source % len(out) :][:length])
            target %= len(out)
            out[target : target + len(chunk)] = chunk
        elif kind == "int":
            offset, fmt, value = args
            packed = struct.pack(fmt, value)
            offset = min(offset, max(0, len(out) - len(packed)))
            out[offset : offset + len(packed)] = packed[: len(out) - offset]
        else:
            raise ValueError(f"unknown mutation {kind!r}")
    return bytes(out)


@dataclass(frozen=True)
class Case:
    sample: str  # a key of make_samples()
    seed: int | None  # None: a hand-kept recipe (a regression) rather than a drawn one
    recipe: Recipe

    @property
    def name(self) -> str:
        return f"{self.sample}-{self.seed}" if self.seed is not None else f"{self.sample}-kept"

    def write(self, samples: dict[str, Path], folder: Path) -> Path:
        source = samples[self.sample]
        path = folder / f"{self.name}{source.suffix}"
        path.write_bytes(mutate(source.read_bytes(), self.recipe))
        return path


def cases(samples: dict[str, Path], count: int, first_seed: int = 0) -> Iterator[Case]:
    """`count` cases, spread round-robin over the samples: seeds first_seed, first_seed + 1 ..."""
    names = sorted(samples)
    data = {name: samples[name].read_bytes() for name in names}
    for i in range(count):
        seed = first_seed + i
        name = names[seed % len(names)]
        yield Case(name, seed, draw_recipe(name, data[name], seed))


# ---------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class Outcome:
    kind: str  # "image", "video" or "error"
    frames: int  # frames sampled (1 for an image)
    message: str = ""  # the MediaError's text for an error


def check(path: str | Path, reader: media.Decoder | None = None) -> Outcome:
    """Probe and sample `path` as ``ffai caption --fps 1 --max-frames 4`` does, in this process
    (no `reader`: ``media.Decoder(isolated=False)``) or in decoder children (a ``media.Decoder()``).
    A MediaError is an outcome; any other exception propagates (it is a finding)."""
    reader = reader or media.Decoder(isolated=False)
    try:
        info = reader.probe(path)
        if info.kind == "image":
            reader.load_image(path)
            frames = 1
        else:
            frames = sum(1 for _ in reader.sample_frames(path, FPS, max_frames=MAX_FRAMES))
        return Outcome(info.kind, frames)
    except MediaError as e:
        return Outcome("error", 0, str(e))


# Files earlier runs found, kept as recipes: (sample, recipe, the error it must now end in).
# The tests run each through probing and sampling and through the whole caption path.
REGRESSIONS: tuple[tuple[str, Recipe, str], ...] = (
    # A flipped bit in the sample description: the stream has no decoder, and formatting that
    # message raised AttributeError (PyAV 18 streams have no .codec).
    ("mov", (("flip", 1814, 3),), "no decoder for its video codec"),
    ("mp4_cut_faststart", (("run", 440, 256, 127),), "no decoder for its video codec"),
    # An IHDR chunk shorter than 13 bytes: Pillow's ValueError escaped Image.open.
    ("png_rgb", (("int", 8, ">I", 4),), "corrupt image: Truncated IHDR chunk"),
    # One size for all samples (stsz) and a count of 2**26 of them, with as many samples a chunk
    # (stsc), in a 2 KB file: FFmpeg indexed every claimed sample, 3.6 GB resident.
    (
        "mp4_default",
        (("int", 2132, ">I", 1), ("int", 2136, ">I", 1 << 26), ("int", 2112, ">I", 1 << 26)),
        "damaged sample table: 67108864 samples of 1 byte(s) claimed in a file of 2306 bytes",
    ),
    # 280 bytes claiming a 2088x13233 canvas, which libwebp allocates and clears (110 MB) before
    # it finds the data missing: the one file of 10 000 over 2x the unmutated peak RSS (README,
    # Hostile files). Kept for its one-line error; the size is legal, so the memory is not refused.
    ("webp_lossy", (("run", 172, 1, 127), ("flip", 54, 2), ("splice", 149, 1024, 26)), "failed to read next frame"),
)
