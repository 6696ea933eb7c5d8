"""Reading a safetensors tensor with an ordinary read into memory of the caller's choosing, not
through the file's map: a mapped file's pages, once touched, count in the process's resident
memory for as long as any tensor keeps the map open, so a loader that converts every weight
(int8, bfloat16) would otherwise hold the whole float32 file beside what it built.
"""

from __future__ import annotations

import json

import torch

FILE_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
CAST_BLOCK_BYTES = 8 << 20  # file bytes staged at a time when a tensor is read with a cast


class RawHeader:
    """A safetensors file's header (JSON after an 8-byte length), for reading a tensor's bytes
    with an ordinary read into memory of our choosing rather than through the map."""

    def __init__(self, raw) -> None:
        self.raw = raw
        raw.seek(0)
        size = int.from_bytes(raw.read(8), "little")
        self.entries = json.loads(raw.read(size))
        self.data_start = 8 + size

    def stored_as(self, name: str, dtype: torch.dtype) -> bool:
        return FILE_DTYPES.get(self.entries[name]["dtype"]) == dtype

    def read_into(self, name: str, dst: torch.Tensor, f) -> torch.Tensor:
        """Fill ``dst`` (same shape) with tensor ``name``, cast to dst's dtype; returns dst."""
        entry = self.entries[name]
        dtype = FILE_DTYPES.get(entry["dtype"])
        begin, end = entry["data_offsets"]
        if dtype is None:  # a dtype read only through safetensors itself
            return dst.copy_(f.get_tensor(name))
        if end - begin != dst.numel() * dtype.itemsize:
            raise ValueError(f"tensor {name}: {end - begin} bytes for shape {list(dst.shape)}")
        if dtype == dst.dtype and dst.device.type == "cpu":
            self._read(name, self.data_start + begin, dst)
            return dst
        # A cast goes through a staging buffer of the file's dtype, a block of rows at a time, so
        # casting the 113 MB embedding table stages 8 MB of it, not all of it.
        rows = dst.shape[0] if dst.dim() else 1
        row_bytes = (end - begin) // max(rows, 1)
        block = max(1, CAST_BLOCK_BYTES // max(row_bytes, 1))
        for start in range(0, rows, block):
            part = dst[start : start + block] if dst.dim() else dst
            staged = torch.empty(part.shape, dtype=dtype)
            self._read(name, self.data_start + begin + start * row_bytes, staged)
            part.copy_(staged)
        return dst

    def _read(self, name: str, offset: int, into: torch.Tensor) -> None:
        size = into.numel() * into.element_size()
        self.raw.seek(offset)
        if size and self.raw.readinto(memoryview(into.view(torch.uint8).numpy()).cast("B")) != size:
            raise ValueError(f"tensor {name}: file ends inside its data")
