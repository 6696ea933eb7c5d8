"""The linear layer both towers use: ``nn.Linear`` computed in its weight's dtype.

For float32 weights and activations both casts are no-ops, so the exact path is the reference's
``F.linear``. With ``--dtype bfloat16`` (``weights.load_model``) the weights are bfloat16 and the
residual streams, norms and attention stay float32: each linear casts its input to bfloat16 and
its output back, so only the products round to bfloat16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)
