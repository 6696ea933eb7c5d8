"""RMSNorm as transformers' ``LlamaRMSNorm`` and ``Qwen3VLTextRMSNorm`` compute it (the same steps),
for every engine's text tower. Imports torch: only the towers use it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """The mean square in float32, then cast back before the weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == self.weight.dtype == torch.float32:
            # On the CPU torch's rms_norm runs these very ops (pow, mean, + eps, rsqrt, two
            # products) in C++: the same bits for a sixth of the Python calls, 61 norms a decode
            # step in SmolVLM (tests/test_smolvlm_fast_paths.py). On a GPU it is a fused kernel that
            # rounds otherwise, so there, and for other dtypes, the reference's own steps.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)
