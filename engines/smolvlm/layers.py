"""Layers both towers use: the linear product, linears fused into one matmul, embedding tables.

Fusion is a shape, not a step: a :class:`FusedLinear` is built fused, and loading
(``weights.load_model``) reads the checkpoint's separate tensors (q_proj, k_proj, v_proj;
gate_proj, up_proj) into their rows of its one weight. Each output is the same dot product as
the separate linears', so the result is bit-identical to running them one by one
(tests/test_smolvlm_fast_paths.py, and the oracle gates against transformers).
"""

from __future__ import annotations

from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, with a one-row input (a decode step) spread over torch's threads.

    torch runs a one-row float32 ``F.linear`` on one thread, which leaves a decode step's
    matrix-vector products at about half the memory bandwidth two cores have (README,
    *Measured*). Here the weight's output rows are cut into one block per thread and ``bmm``
    computes the blocks in parallel: every output is the same dot product by the same kernel, so
    the result is bit for bit ``F.linear``'s (tests/test_smolvlm_fast_paths.py). Small blocks
    (fewer than 64 rows or columns) take other kernels, whose sums may round differently: those
    stay on F.linear.
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
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == "cpu"
    ):
        blocks = weight.view(p, n // p, k).transpose(1, 2)  # (p, k, n / p)
        return torch.bmm(x.reshape(1, 1, k).expand(p, 1, k), blocks).view(*x.shape[:-1], n)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` computed by :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


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
