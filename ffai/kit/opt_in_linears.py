"""The linear layers of the opt-in dtypes: int8 (:class:`QuantizedLinear` on fbgemm,
:class:`OneDnnInt8Linear` on oneDNN, :class:`RowScaledLinear` by row) and bfloat16 reordered
for oneDNN (:class:`PackedBf16Linear`).

Which linear becomes which, and with what settings, is the precision plan's choice
(each engine's precision plan, e.g. ``ffai.engines.smolvlm.precision``); the loader builds these from the checkpoint's float weights as
they are read, so no float copy stays resident.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ffai.kit.linears import several_sequences

# torch marks its quantised tensors deprecated; OneDnnInt8Linear quantises each call's
# activations through one (the fastest of torch's quantisers) and keeps only its bytes.
warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel")


class QuantizedLinear(nn.Module):
    """A linear layer with int8 weights and dynamically quantised activations (``--dtype int8``).

    The weight is quantised per output channel (symmetric, one float32 scale per row) and
    prepacked once for fbgemm (AVX2, AVX-512, VNNI); each call quantises its input to 8 bits by
    the input's own range, multiplies in int8 with int32 sums and returns float32 (bias added in
    float32). The packed weight is the only copy: no float32 weight stays resident. ``parts`` is
    kept from a ``layers.FusedLinear``. Which layers take it on which CPU is
    ``kernels.int8_linears``' (a tile's rows go to :class:`OneDnnInt8Linear` where oneDNN's int8
    sums are exact).

    ``reduce_range`` quantises activations to 7 bits, for CPUs whose int8 dot product
    saturates in 16 bits (AVX2's vpmaddubsw); AVX-512 VNNI sums u8 x s8 straight into 32 bits,
    so there all 8 bits are used (``ffai.kit.linear_kinds.INT8_FULL_RANGE_FLAGS``).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        reduce_range: bool,
        parts: tuple[int, ...] = (),
    ):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.parts = parts
        self.reduce_range = reduce_range
        self.packed = pack_int8(weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if several_sequences(x):  # each row by its own range, as it would be alone
            return torch.cat(
                [torch.ops.quantized.linear_dynamic(r, self.packed, self.reduce_range) for r in x.split(1)]
            )
        return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (fbgemm)"


class OneDnnInt8Linear(nn.Module):
    """An int8 linear layer on oneDNN's int8 matmul (``--dtype int8``, a tile's many rows on a CPU
    whose int8 dot product sums u8 x s8 into 32 bits: AVX-512 VNNI, AMX-INT8).

    The weight is :class:`QuantizedLinear`'s (symmetric, one float32 scale per output row),
    reordered once for oneDNN (``onednn.qlinear_prepack``: the only copy, where torch's own
    dynamic linear on oneDNN kept the int8 original beside its packed weight); each call
    quantises its input to 8 bits by the call's own range and runs torch's
    ``onednn.qlinear_pointwise``, the kernel inductor runs for a quantised linear, with float32
    output. :meth:`gelu_tanh` fuses the MLP's GELU into it as a post-op on the float32 sums:
    no separate pass over a tile's 1024 x 3072 activations (docs/precision-and-speed.md).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, parts: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.parts = parts
        w = weight.detach().to(torch.float32)
        self.scale = row_scales(w)  # (out,) float32
        self.packed = torch.ops.onednn.qlinear_prepack(quantize_rows(w, self.scale), None)
        self.zero = torch.zeros(self.out_features, dtype=torch.long)
        self.bias = None if bias is None else bias.detach().to(torch.float32)

    def _matmul(self, x: torch.Tensor, post_op: str, algorithm: str) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:  # no range to quantise by
            return rows.new_zeros((*x.shape[:-1], self.out_features), dtype=torch.float32)
        q = torch.quantize_per_tensor_dynamic(rows.float(), torch.quint8, False)
        # The quantised tensor's bytes as the plain uint8 tensor the kernel takes, not copied.
        qx = torch.empty(0, dtype=torch.uint8).set_(q.untyped_storage(), q.storage_offset(), q.size(), q.stride())
        y = torch.ops.onednn.qlinear_pointwise(
            qx, q.q_scale(), q.q_zero_point(), self.packed, self.scale, self.zero, self.bias,
            1.0, 0, torch.float32, post_op, [], algorithm,
        )  # fmt: skip
        return y.view(*x.shape[:-1], self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, "none", "")

    def gelu_tanh(self, x: torch.Tensor) -> torch.Tensor:
        """GELU (tanh approximation) of this layer's output, as a post-op on the float32 sums."""
        return self._matmul(x, "gelu", "tanh")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (oneDNN)"


class RowScaledLinear(nn.Module):
    """An int8 linear layer (``--dtype int8``) for inputs whose rows differ in range by orders of
    magnitude: the same int8 weight as :class:`QuantizedLinear` (symmetric, one scale per
    output row), held plain, (out, in) int8, and no activation scale shared between rows.

    fbgemm's dynamic kernel gives all rows of a call one activation scale, which loses the small
    rows of a prefill to its largest. So here several rows (a prefill) are multiplied in
    ``rows_dtype`` by the int8 weight cast exactly to it (int8 values are exact in bfloat16), then
    scaled by row in float32: bfloat16 where the CPU multiplies it natively, where its 8-bit
    mantissa is relative to each value, so no row and no channel is lost to another; float32
    elsewhere. One row (a decode step) is the same product where ``rows_dtype`` is bfloat16
    (``torch._weight_int8pack_mm``, a one-row kernel, with unit scales so the weight's stay
    float32), and elsewhere quantised to int8 by its own range and multiplied by
    ``torch._int_mm`` (int32 sums) where ``int_mm`` (the CPU sums u8 x s8 into 32 bits: oneDNN's
    AVX2 kernel saturates in 16 and is not exact, tests/test_smolvlm_precision.py), else in
    float32 by the weight cast exactly. ``kernels.int8_linears`` says which layers take it.
    Holding the weight plain spares unpacking fbgemm's at every prefill call.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        rows_dtype: torch.dtype,
        int_mm: bool = True,
        parts: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.parts = parts
        self.rows_dtype = rows_dtype
        self.int_mm = int_mm
        w = weight.detach().to(torch.float32)
        scale = row_scales(w)
        # Plain attributes, not buffers: int8 runs on the CPU only, and nothing here is trained.
        self.int8_weight = quantize_rows(w, scale)  # (out, in) int8
        self.scale = scale  # (out,) float32
        self.bias = None if bias is None else bias.detach().to(torch.float32)
        self.unit = torch.ones(self.out_features, dtype=rows_dtype)  # _weight_int8pack_mm's scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        n, step_rows = rows.shape[0], several_sequences(x)
        if (n == 1 or step_rows) and self.rows_dtype == torch.bfloat16:
            # This kernel sums each row on its own, so several sequences share one weight read.
            y = torch._weight_int8pack_mm(rows.to(torch.bfloat16), self.int8_weight, self.unit)
            y = y.float().mul_(self.scale)
        elif n == 1 and self.int_mm:  # the step as a Python float: fewer ops (CPU-only, no sync)
            step = max(float(rows.abs().max()), 1e-30) / 127.0
            y = torch._int_mm(torch.mul(rows, 1.0 / step).round_().to(torch.int8), self.int8_weight.t())
            y = torch.mul(y, self.scale * step)  # int32 sums -> float32
        elif step_rows and self.int_mm:  # each row's step as one alone computes it, in double
            step = rows.abs().amax(1, keepdim=True).double().clamp_min(1e-30) / 127.0
            q = torch.mul(rows, (1.0 / step).float()).round_().to(torch.int8)
            y = torch._int_mm(q, self.int8_weight.t()) * (self.scale * step.float())
        else:
            y = F.linear(rows.to(self.rows_dtype), self.int8_weight.to(self.rows_dtype))
            y = torch.mul(y, self.scale) if y.dtype == torch.float32 else y.float().mul_(self.scale)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 by row ({self.rows_dtype})"


def pack_int8(weight: torch.Tensor, bias: torch.Tensor | None):
    """float (out, in) weight -> torch's int8 weight prepacked for fbgemm, per-row symmetric
    scales. A packed weight keeps fbgemm's kernel whichever quantised engine torch has selected
    when it runs."""
    w = weight.detach().to(torch.float32)
    scale = row_scales(w).to(torch.float64)  # (out,)
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # torch 2.13 marks quantised tensors deprecated; its dynamic int8 linear still takes them.
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch._make_per_channel_quantized_tensor(quantize_rows(w, scale), scale, zero, 0)
    b = None if bias is None else bias.detach().to(torch.float32)
    engines = torch.backends.quantized
    if "fbgemm" not in engines.supported_engines:
        raise ValueError(f"torch has no fbgemm engine here (it has {engines.supported_engines})")
    chosen = engines.engine
    engines.engine = "fbgemm"  # prepack reads the global choice; set only for this call
    try:
        return torch.ops.quantized.linear_prepack(qweight, b)
    finally:
        engines.engine = chosen


def row_scales(w: torch.Tensor) -> torch.Tensor:
    """float32 (out, in) weight -> (out,) float32 symmetric int8 scales, one per row."""
    low, high = torch.aminmax(w, dim=1)  # not w.abs(): no temporary the size of the weight
    return (torch.maximum(-low, high) / 127.0).clamp(min=1e-12)


QUANTIZE_ROWS_BLOCK = 2048  # rows quantised at a time: a float32 temporary of at most 2048 x in


def quantize_rows(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 (out, in) weight -> int8 values, row r as ``torch.quantize_per_channel`` makes them
    with zero points 0: round-half-even of ``w * (1.0f / float(scale[r]))``, clamped to int8.
    The same bits (tests/test_smolvlm_precision.py), faster than torch's per-channel kernel,
    which was the bulk of an int8 load. Done in blocks of rows, so the float32 temporary stays
    small beside the LM head's."""
    inverse = 1.0 / scale.to(torch.float32)  # (out,) float32, as fbgemm's 1.0f / scale
    out = torch.empty(w.shape, dtype=torch.int8)
    for start in range(0, w.shape[0], QUANTIZE_ROWS_BLOCK):
        rows = slice(start, start + QUANTIZE_ROWS_BLOCK)
        out[rows] = (w[rows] * inverse[rows, None]).round_().clamp_(-128, 127)
    return out


class PackedBf16Linear(nn.Module):
    """A linear layer of ``--dtype bfloat16`` on a CPU with native bfloat16: the weight in
    bfloat16, reordered once into oneDNN's blocked layout, and every call a oneDNN bfloat16
    matmul with float32 sums (torch's own ``mkldnn._linear_pointwise``, what inductor runs for a
    frozen bfloat16 linear). The input is cast to bfloat16 and the output back to the input's
    dtype, as ``layers.Linear`` does.

    Several rows give the same values as ``F.linear`` in bfloat16 (the same oneDNN kernel, minus
    reordering the weight at every call; tests/test_smolvlm_precision.py). The gain is the one-row
    product of a decode step, which torch sends to a slow bfloat16 matrix-vector path.
    """

    # It computes in bfloat16 whatever it is given: a caller holding bfloat16 rows may pass them
    # and take bfloat16 back, the same values without the round trip through float32.
    computes_in_bfloat16 = True

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

    def gelu_tanh(self, x: torch.Tensor) -> torch.Tensor:
        """GELU (tanh approximation) of this layer's output, fused into oneDNN's matmul as a
        post-op on its float32 sums, returned in bfloat16 for the next packed layer: no
        separate GELU pass over the activations and no cast in and out of float32 around it."""
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "gelu", [], "tanh")
        return y.view(*x.shape[:-1], self.out_features)

    def dense_weight(self) -> torch.Tensor:
        """The weight as a plain (out, in) bfloat16 tensor (a copy where it is reordered)."""
        return self.packed.to_dense()

    def hold_plain(self) -> torch.Tensor:
        """Hold the weight as a plain (out, in) bfloat16 tensor instead of the reordered copy, and
        return it: for a holder that reads the plain weight itself (the compiled decode step), so
        the weight is held once. oneDNN then reorders it at each call (a decode row about twice as
        slow) and may sum a call's rows in another order (a prefill moves within bfloat16's
        rounding). :meth:`reorder` undoes it."""
        if self.packed.is_mkldnn:
            self.packed = self.packed.to_dense()
        return self.packed

    def reorder(self) -> None:
        """Hold the weight reordered for oneDNN again (after :meth:`hold_plain`)."""
        if not self.packed.is_mkldnn:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.packed, 1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16 packed"


def onednn_bf16(device: str = "cpu") -> bool:
    """Whether oneDNN multiplies bfloat16 natively on ``device`` (a CPU with AVX512_BF16 or AMX;
    torch asks oneDNN), so that :class:`PackedBf16Linear` runs there."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
