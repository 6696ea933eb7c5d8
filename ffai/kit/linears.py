"""The layers every tower is made of: the linear product, linears fused into one matmul,
embedding tables (in memory, or left in their file).

Fusion is a shape, not a step: a :class:`FusedLinear` is built fused, and loading
(``ffai.kit.loading``) reads the checkpoint's separate tensors (q_proj, k_proj, v_proj;
gate_proj, up_proj) into their rows of its one weight. Each output is the same dot product as
the separate linears', so the result is bit-identical to running them one by one
(tests/test_kit.py, and the oracle gates against transformers).
"""

from __future__ import annotations

import os
from itertools import accumulate
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ffai.errors import ModelError


def several_sequences(x: torch.Tensor) -> bool:
    """Whether ``x`` is a decode step of several sequences, (B, 1, D) with B > 1: each row is then
    computed as it would be alone, so a sequence's tokens do not depend on its batch."""
    return x.dim() == 3 and x.shape[1] == 1 and x.shape[0] > 1


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, with a one-row input (a decode step) spread over torch's threads.

    torch runs a one-row float32 ``F.linear`` on one thread, which leaves a decode step's
    matrix-vector products at about half the memory bandwidth two cores have
    (docs/benchmarks.md). Here the weight's output rows are cut into one block per thread and ``bmm``
    computes the blocks in parallel: every output is the same dot product by the same kernel, so
    the result is bit for bit ``F.linear``'s (tests/test_kit.py). Small blocks
    (fewer than 64 rows or columns) take other kernels, whose sums may round differently: those
    stay on F.linear.

    A one-row bfloat16 ``F.linear`` is worse still (torch's bf16 matrix-vector path, several times
    float32's on an AVX512_BF16 CPU), so bfloat16 takes the same blocks: its rounding is
    bfloat16's either way (``--dtype bfloat16`` is opt-in and never called identical).
    """
    if several_sequences(x):  # a kernel picks its sum order by the row count: each row alone
        return torch.cat([linear(row, weight, bias) for row in x.split(1)])
    p = torch.get_num_threads()
    n, k = weight.shape
    if (
        p > 1
        and bias is None
        and x.numel() == k
        and n % p == 0
        and n // p >= 64
        and k >= 64
        and weight.is_contiguous()
        and x.dtype == weight.dtype
        and x.dtype in (torch.float32, torch.bfloat16)
        and x.device.type == "cpu"
    ):
        blocks = weight.view(p, n // p, k).transpose(1, 2)  # (p, k, n / p)
        return torch.bmm(x.reshape(1, 1, k).expand(p, 1, k), blocks).view(*x.shape[:-1], n)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` computed by :func:`linear`, in the weight's dtype: an input of another dtype
    (float32 activations into ``--dtype bfloat16``'s text tower) is cast to it and the output
    back; for matching dtypes both casts are no-ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


class FusedLinear(Linear):
    """Linears that read the same input, as one: their weights (and biases) stacked by rows in
    ``parts`` order, ``parts`` giving each one's output size. The checkpoint keeps them
    separate; the weight-name table says which part each of its tensors fills."""

    def __init__(self, in_features: int, parts: tuple[int, ...], bias: bool) -> None:
        super().__init__(in_features, sum(parts), bias=bias)
        self.parts = tuple(parts)

    def part_rows(self) -> list[slice]:
        """Each part's rows of the weight (and bias), in order."""
        return [slice(end - size, end) for size, end in zip(self.parts, accumulate(self.parts))]


def embedding_table(rows: int, dim: int) -> nn.Embedding:
    """An nn.Embedding left uninitialised (the checkpoint fills it). Its default init, normal_,
    on the meta device imports torch's symbolic-shape machinery, which stays resident in every
    process that builds a model (docs/benchmarks.md)."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class FileEmbedding(nn.Module):
    """An embedding table left in its safetensors file: a lookup reads the rows it needs with
    ``os.preadv`` (each distinct id once) and casts them to ``dtype``, so the table lives in the
    page cache, shared and reclaimable, and never in this process's memory. Rows are exactly the
    stored ones, cast as loading casts them, so a lookup equals ``nn.Embedding``'s over the
    loaded table (tests/test_kit.py). Used where a precision plan says nothing else reads the
    table whole (``PrecisionPlan.embeddings_in_file``: the LM head holds its own copy); a prompt
    reads a few hundred rows, a decode step one."""

    def __init__(
        self, path: Path | str, offset: int, shape: tuple[int, int], file_dtype: torch.dtype, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.path, self.offset = str(path), offset
        self.num_embeddings, self.embedding_dim = shape
        self.file_dtype, self.dtype = file_dtype, dtype
        self.row_bytes = self.embedding_dim * file_dtype.itemsize
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        distinct, where = torch.unique(ids.reshape(-1).cpu(), return_inverse=True)
        if distinct.numel() and not (0 <= int(distinct[0]) and int(distinct[-1]) < self.num_embeddings):
            raise IndexError(f"token id out of range for an embedding table of {self.num_embeddings} rows")
        rows = torch.empty(distinct.numel(), self.embedding_dim, dtype=self.file_dtype)
        buffer = memoryview(rows.view(torch.uint8).numpy().reshape(-1))
        size = self.row_bytes
        for i, token in enumerate(distinct.tolist()):
            if os.preadv(self._fd, [buffer[i * size : (i + 1) * size]], self.offset + token * size) != size:
                raise ModelError(f"{self.path}: the file ends inside its embedding table (changed since loading?)")
        return rows.to(self.dtype)[where].view(*ids.shape, self.embedding_dim).to(ids.device)

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, read from {self.path}"
