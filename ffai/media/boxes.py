"""ISO base media boxes (MP4, MOV, 3GP ...): the sample-table claims of a file checked against
its size before FFmpeg allocates for them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ffai.errors import MediaError

# ISO base media (MP4, MOV, 3GP ...): the boxes whose children the sample tables sit in, and
# the leading box types that mark such a file.
_BMFF_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}
_BMFF_FIRST = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot"}
_BMFF_MOOV_MAX = 256 << 20  # a sample index larger than this is not read here (nor claimed small)


def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in data[start:end], as FFmpeg's mov
    demuxer walks them: a size of 0 runs to the end, 1 means a 64-bit size follows, a box that
    overruns its parent is cut to it, and a size below the header ends the walk."""
    while start + 8 <= end:
        size, kind = int.from_bytes(data[start : start + 4], "big"), data[start + 4 : start + 8]
        header = 8
        if size == 1 and start + 16 <= end:
            size, header = int.from_bytes(data[start + 8 : start + 16], "big"), 16
        elif size == 0:
            size = end - start
        if size < header:
            return
        yield kind, start + header, min(start + size, end)
        start += size


def check_sample_claims(file: Path) -> None:
    """Refuse an MP4/MOV whose sample table claims more samples than the file can hold.

    A "stsz" box with one size for every sample stores only that size and a count: FFmpeg then
    builds an index entry (and timing entries) for each claimed sample, so a damaged count in a
    tiny file grows a decoder to gigabytes before it fails (docs/hostile-files.md). Samples live
    in the file, so the claim is checked against the file's size first."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8 or head[4:8] not in _BMFF_FIRST:
            return
        offset = 0
        while offset + 8 <= size:
            f.seek(offset)
            header = f.read(16)
            box = int.from_bytes(header[:4], "big")
            box = int.from_bytes(header[8:16], "big") if box == 1 else (size - offset if box == 0 else box)
            if box < 8:
                return
            if header[4:8] == b"moov" and box <= _BMFF_MOOV_MAX:
                f.seek(offset)
                _check_moov(file, f.read(box), size)
            offset += box


def _check_moov(file: Path, moov: bytes, file_size: int) -> None:
    pending = [(0, len(moov))]  # the moov box itself first, then each container box found
    for start, end in pending:
        for kind, payload, stop in _boxes(moov, start, end):
            if kind in _BMFF_CONTAINERS:
                pending.append((payload, stop))
            elif kind == b"stsz" and stop - payload >= 12:
                sample_size = int.from_bytes(moov[payload + 4 : payload + 8], "big")
                count = int.from_bytes(moov[payload + 8 : payload + 12], "big")
                if sample_size and count * sample_size > file_size:
                    raise MediaError(
                        f"{file}: damaged sample table: {count} samples of {sample_size} byte(s) "
                        f"claimed in a file of {file_size} bytes"
                    )
