"""Layers both towers use: the linear product, linears fused into one matmul, embedding tables.

Fusion is a shape, not a step: a :class:`FusedLinear` is built fused, and loading
(``weights.load_model``) reads the checkpoint's separate tensors (q_proj, k_proj, v_proj;
gate_proj, up_proj) into their rows of its one weight. Each output is the same dot product as
the separate linears', so the result is bit-identical to running them one by one
(tests/test_smolvlm_fast_paths.py, and the oracle gates against transformers).
"""

from __future__ import annotations

import os
from itertools import accumulate
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ffai.errors import ModelError


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, with a one-row input (a decode step) spread over torch's threads.

    torch runs a one-row float32 ``F.linear`` on one thread, which leaves a decode step's
    matrix-vector products at about half the memory bandwidth two cores have (README,
    *Measured*). Here the weight's output rows are cut into one block per thread and ``bmm``
    computes the blocks in parallel: every output is the same dot product by the same kernel, so
    the result is bit for bit ``F.linear``'s (tests/test_smolvlm_fast_paths.py). Small blocks
    (fewer than 64 rows or columns) take other kernels, whose sums may round differently: those
    stay on F.linear.

    A one-row bfloat16 ``F.linear`` is worse still (torch's bf16 matrix-vector path; measured up to
    10x float32's on an AVX512_BF16 CPU), so bfloat16 takes the same blocks: its rounding is
    bfloat16's either way (``--dtype bfloat16`` is opt-in and never called identical).
    """
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
    process that builds a model (README, *Measured*)."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class FileEmbedding(nn.Module):
    """An embedding table left in its safetensors file: a lookup reads the rows it needs with
    ``os.preadv`` (each distinct id once) and casts them to ``dtype``, so the table lives in the
    page cache, shared and reclaimable, and never in this process's memory. Rows are exactly the
    stored ones, cast as loading casts them, so a lookup equals ``nn.Embedding``'s over the
    loaded table (tests/test_smolvlm_precision.py). Used by the opt-in dtypes, whose LM head has
    its own copy (``weights._embeddings_left_in_file``); a prompt reads ~100-900 rows (about
    2 µs each), a decode step one."""

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


class QuantizedLinear(nn.Module):
    """A linear layer with int8 weights and dynamically quantised activations (``--dtype int8``).

    The weight is quantised per output channel (symmetric, one float32 scale per row) and
    prepacked once for torch's quantised engine (fbgemm's kernels under ``x86``: AVX2, AVX-512,
    VNNI); each call quantises its input to 8 bits by the input's own range, multiplies in int8
    with int32 sums and returns float32 (bias added in float32). The packed weight is the only
    copy: no float32 weight stays resident. ``parts`` is kept from a :class:`FusedLinear`.

    Chosen by measurement on an AVX-512 VNNI CPU, 2 threads, against torch's other int8 routes:
    a vision-tower linear (1024 x 768 -> 3072) took 28 ms here (fbgemm through the ``x86``
    engine) against 36 ms through oneDNN, 34 ms through ``torch._int_mm`` with per-row
    activation scales, 46 ms in bfloat16 and 105 ms in float32; the LM head as one decode row
    (576 -> 49280) 0.5-1 ms against oneDNN's 0.8-2.4 ms and float32's 10-16 ms.

    ``reduce_range`` quantises activations to 7 bits, for CPUs whose int8 dot product
    saturates in 16 bits (AVX2's vpmaddubsw); AVX-512 VNNI sums u8 x s8 straight into 32 bits,
    so there all 8 bits are used (``weights.int8_reduce_range``): on the real-shape checkpoint
    that took the tile embeddings' cosine with float32 from 0.9984 to 0.9994.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, reduce_range: bool, parts: tuple[int, ...] = ()
    ):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.parts = parts
        self.reduce_range = reduce_range
        self.packed = pack_int8(weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class RowScaledLinear(nn.Module):
    """An int8 linear layer (``--dtype int8``) for inputs whose rows differ in range by orders of
    magnitude: the same int8 weight as :class:`QuantizedLinear` (symmetric, one scale per
    output row), held plain, (out, in) int8, and no activation scale shared between rows.

    fbgemm's dynamic kernel gives all rows of a call one activation scale, which loses the small
    rows of a prefill to its largest. So here one row (a decode step) is quantised to int8 by its
    own range and multiplied by ``torch._int_mm`` (int32 sums); several rows (a prefill) are
    multiplied in ``rows_dtype`` by the int8 weight cast exactly to it (int8 values are exact in
    bfloat16), then scaled by row in float32: bfloat16 where the CPU multiplies it natively, where
    its 8-bit mantissa is relative to each value, so no row and no channel is lost to another;
    float32 elsewhere. ``weights.INT8_ROW_SCALED`` says which layers need it.

    Measured on an AVX512_BF16 Zen 4, 2 threads, the text MLP's down projection (1536 -> 576):
    600 rows 2.7 ms, 100 rows 0.57 ms, against 6.9 and 2.5 ms when the rows were multiplied in
    float32 by the fbgemm weight unpacked and dequantised at every call (the unpacking alone
    1.2 ms), with the output's cosine with float32 0.999997; one row 35 µs against fbgemm's 26
    (``torch._int_mm`` alone 15).
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, rows_dtype: torch.dtype, parts: tuple[int, ...] = ()
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.parts = parts
        self.rows_dtype = rows_dtype
        w = weight.detach().to(torch.float32)
        scale = row_scales(w)
        # Plain attributes, not buffers: int8 runs on the CPU only, and nothing here is trained.
        self.int8_weight = quantize_rows(w, scale)  # (out, in) int8
        self.scale = scale  # (out,) float32
        self.bias = None if bias is None else bias.detach().to(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 1:  # the step as a Python float: fewer ops (int8 is CPU-only, no sync)
            step = max(float(rows.abs().max()), 1e-30) / 127.0
            y = torch._int_mm(torch.mul(rows, 1.0 / step).round_().to(torch.int8), self.int8_weight.t())
            y = torch.mul(y, self.scale * step)  # int32 sums -> float32
        else:
            y = F.linear(rows.to(self.rows_dtype), self.int8_weight.to(self.rows_dtype))
            y = torch.mul(y, self.scale) if y.dtype == torch.float32 else y.float().mul_(self.scale)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 by row ({self.rows_dtype})"


def pack_int8(weight: torch.Tensor, bias: torch.Tensor | None):
    """float (out, in) weight -> torch's prepacked int8 weight, per-row symmetric scales."""
    import warnings

    w = weight.detach().to(torch.float32)
    scale = row_scales(w).to(torch.float64)  # (out,)
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # torch 2.13 marks quantised tensors deprecated; its dynamic int8 linear still takes them.
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch._make_per_channel_quantized_tensor(quantize_rows(w, scale), scale, zero, 0)
    b = None if bias is None else bias.detach().to(torch.float32)
    return torch.ops.quantized.linear_prepack(qweight, b)


def row_scales(w: torch.Tensor) -> torch.Tensor:
    """float32 (out, in) weight -> (out,) float32 symmetric int8 scales, one per row."""
    low, high = torch.aminmax(w, dim=1)  # not w.abs(): no temporary the size of the weight
    return (torch.maximum(-low, high) / 127.0).clamp(min=1e-12)


QUANTIZE_ROWS_BLOCK = 2048  # rows quantised at a time: a float32 temporary of at most 2048 x in


def quantize_rows(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 (out, in) weight -> int8 values, row r as ``torch.quantize_per_channel`` makes them
    with zero points 0: round-half-even of ``w * (1.0f / float(scale[r]))``, clamped to int8.
    The same bits (tests/test_smolvlm_precision.py), about 3x faster: torch's per-channel kernel
    is the bulk of an int8 load (2-2.4 s of 3.7 on the real-shape checkpoint, 2 threads). Done in
    blocks of rows, so the float32 temporary stays small beside the LM head's 113 MB."""
    inverse = 1.0 / scale.to(torch.float32)  # (out,) float32, as fbgemm's 1.0f / scale
    out = torch.empty(w.shape, dtype=torch.int8)
    for start in range(0, w.shape[0], QUANTIZE_ROWS_BLOCK):
        rows = slice(start, start + QUANTIZE_ROWS_BLOCK)
        out[rows] = (w[rows] * inverse[rows, None]).round_().clamp_(-128, 127)
    return out


def bf16_packing_available(device="cpu") -> bool:
    """Whether :class:`PackedBf16Linear` runs here: on a CPU where oneDNN multiplies bfloat16
    natively (AVX512_BF16 or AMX; torch asks oneDNN)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class PackedBf16Linear(nn.Module):
    """A linear layer of ``--dtype bfloat16`` on a CPU with native bfloat16: the weight in
    bfloat16, reordered once into oneDNN's blocked layout, and every call a oneDNN bfloat16
    matmul with float32 sums (torch's own ``mkldnn._linear_pointwise``, what inductor runs for a
    frozen bfloat16 linear). The input is cast to bfloat16 and the output back to the input's
    dtype, as :class:`Linear` does.

    Several rows give the same values as ``F.linear`` in bfloat16 (the same oneDNN kernel, minus
    reordering the weight at every call; tests/test_smolvlm_precision.py). The gain is the one-row
    product of a decode step, which torch sends to a slow bfloat16 matrix-vector path: measured
    on an AVX512_BF16 Zen 4, 2 threads, 576 -> 3072 took 50 µs packed against 103 µs
    (``F.linear``) and 139 µs in float32, and the LM head (576 -> 49280) 1.8 ms against 3.4 and 9.9.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, parts: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.parts = parts
        w = weight.detach().to(torch.bfloat16).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def dense_weight(self) -> torch.Tensor:
        """The weight as a plain (out, in) bfloat16 tensor (a copy, for checks)."""
        return self.packed.to_dense()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16 packed"
