"""int8's decode step with its layers compiled by torch's inductor (opt-in:
``FFAI_COMPILE_DECODE=1``), the compiled code cached on disk under ffai's home so a machine pays
the compile once.

:func:`layer_step` is one decoder layer of ``generate.decode_one_token`` at static shapes: one
token, the layer's whole cache with the positions after ``pos`` masked (gpt-fast's form), the
position a tensor. A :class:`LayerSpan` runs it over a run of consecutive layers, and each run
whose layers trace is one compiled graph: one call and one guard check a step (a graph per
layer cost as much in guards as it saved). The cache's length is marked dynamic, so the graph
serves every step of every request, a longer cache included. The layers' own linears run inside
it, so the kernels are the eager ones; what the compiler removes is the Python between them
(about 20 ops a layer for one row), and it fuses the norms, RoPE and residual additions, which
then round a little otherwise than eager's (docs/precision-and-speed.md). Only layers whose
linears are int8 by row with bfloat16 rows (``RowScaledLinear``'s one-row
``torch._weight_int8pack_mm``) are compiled: fbgemm's packed weights (int8's LM head, its linears
on CPUs without native bfloat16) cannot be traced, oneDNN's packed bfloat16 weights (the plan's
wide first layers, and ``--dtype bfloat16``) are taken by inductor only as constants of a frozen
graph, which is not cached on disk. Those layers run the same function uncompiled, and the norm
and LM head run eagerly.

:class:`CompiledDecode` owns the cache folder (``cache_dir``: keyed by the weight files'
identity, the dtype, torch's version and the CPU's flags; inductor adds the thread count to its
own keys), the one-time compile with its progress line, and the fallback: a folder that cannot
be written, or a compile that fails, leaves the eager step with one warning. float32 never comes
here: its eager path is the exact one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ffai import host, messages
from ffai.models import ffai_home
from ffai.opt_in_linears import RowScaledLinear

from .text import DecoderLayer, KVCache, TextModel, apply_rope

# Set to 1 to compile int8's decode step (docs/precision-and-speed.md, "Compiled decode").
ENV = "FFAI_COMPILE_DECODE"
DTYPES = ("int8",)
MARKER = "compiled.json"  # written once a compile has filled the folder


def enabled(dtype: str) -> bool:
    return dtype in DTYPES and os.environ.get(ENV, "") == "1"


def layer_step(layer: DecoderLayer, x, pos, cos, sin, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """``layer`` on the (1, 1, D) hidden state of the token at ``pos`` ((1,) long): its key and
    value written into the caches at ``pos``, attention over the filled prefix. ``cos``/``sin``
    are the RoPE rows at ``pos`` ((1, hd) each)."""
    attn, mlp = layer.self_attn, layer.mlp
    h, kv, hd = attn.n_heads, attn.n_kv, attn.head_dim
    qkv = attn.qkv.forward(layer.input_layernorm.forward(x)).view(1, 1, h + 2 * kv, hd)
    q, k = apply_rope(qkv[:, :, : h + kv].transpose(1, 2), cos, sin).split([h, kv], dim=1)  # (1, H | Hkv, 1, hd)
    v = qkv[:, :, h + kv :].transpose(1, 2)  # (1, Hkv, 1, hd)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    mask = (torch.arange(k_cache.shape[2], device=x.device) <= pos)[None, :]  # (1, L): the filled prefix
    y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, scale=hd**-0.5, enable_gqa=h != kv)
    x = x + attn.o_proj.forward(y.transpose(1, 2).reshape(1, 1, h * hd))
    return x + mlp.forward(layer.post_attention_layernorm.forward(x))


def compilable(layer: DecoderLayer) -> bool:
    """Whether every linear of ``layer`` traces: int8 by row with bfloat16 rows, whose one row is
    ``torch._weight_int8pack_mm`` (with float32 rows it reads the row's range as a Python float)."""
    linears = (layer.self_attn.qkv, layer.self_attn.o_proj, layer.mlp.gate_up, layer.mlp.down_proj)
    return all(isinstance(m, RowScaledLinear) and m.rows_dtype == torch.bfloat16 for m in linears)


def cache_dir(weights: list[Path], dtype: str) -> Path:
    """The folder for one checkpoint's compiled step in ``dtype`` on this machine and torch. The
    graph holds no weights (they stay inputs), so the files' identity keys it, not their hash."""
    identity: list = [dtype, torch.__version__, sorted(host.cpu_info().flags)]
    for path in weights:
        st = path.stat()
        identity.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    return ffai_home() / "compiled" / f"smolvlm-decode-{dtype}-{key}"


class LayerSpan(nn.Module):
    """Consecutive layers, each as :func:`layer_step`; ``ks``/``vs`` are their caches."""

    def __init__(self, layers) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, x, pos, cos, sin, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
        for layer, k, v in zip(self.layers, ks, vs):
            x = layer_step(layer, x, pos, cos, sin, k, v)
        return x


def runs(layers) -> list[tuple[int, int, bool]]:
    """(start, end, compilable) for each run of consecutive layers alike in :func:`compilable`."""
    spans: list[tuple[int, int, bool]] = []
    for i, layer in enumerate(layers):
        traces = compilable(layer)
        if spans and spans[-1][2] == traces:
            spans[-1] = (spans[-1][0], i + 1, traces)
        else:
            spans.append((i, i + 1, traces))
    return spans


class CompiledDecode:
    """int8's decode step for one text tower: :func:`layer_step` compiled for the layers that
    trace (:func:`compilable`), the others running it uncompiled, the code kept in ``folder``.
    Compiled by the first call. A call returns the logits, or None where there is no compiled step
    (the caller then takes the eager step); the reason is warned once."""

    def __init__(self, text: TextModel, folder: Path, dtype: str) -> None:
        self.text, self.folder, self.dtype = text, folder, dtype
        self.steps: list | None = None  # (start, end, LayerSpan compiled or not) by runs of layers
        self.failed = False

    def __call__(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor | None:
        """(1, 1, D) embedding of the token at ``pos`` ((1,) long) -> (1, vocab) logits, or None."""
        if self.failed or x.shape[0] != 1:
            return None
        first = self.steps is None
        if first and not self._prepare():
            return None
        try:
            logits = self._run(x, pos, cache)  # the first call compiles, or loads the cached code
        except Exception as e:  # noqa: BLE001 - any failure of the compiler leaves the eager step
            self._fail(f"could not compile the decode step ({type(e).__name__}: {str(e).splitlines()[0]})")
            return None
        marker = self.folder / MARKER
        if first and not marker.is_file():
            with contextlib.suppress(OSError):  # only the next process's note depends on it
                marker.write_text(json.dumps({"dtype": self.dtype, "torch": torch.__version__}) + "\n")
        return logits

    def _run(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        first = int(pos[0])
        cos, sin = self.text._rope_rows(first, first + 1, x)
        if 2 not in getattr(cache.k[0], "_dynamo_dynamic_indices", ()):  # one graph for every cache length
            for t in (*cache.k, *cache.v):
                torch._dynamo.mark_dynamic(t, 2)
        for start, end, step in self.steps:
            x = step(x, pos, cos, sin, cache.k[start:end], cache.v[start:end])
        return self.text.lm_head.forward(self.text.norm.forward(x))[:, -1]

    def _prepare(self) -> bool:
        """The steps by runs of layers, with the cache folder ready; False (warned) where there are none."""
        if not any(compilable(layer) for layer in self.text.layers):
            self._fail(f"no layer of this CPU's {self.dtype} plan can be compiled")
            return False
        try:
            (self.folder / "inductor").mkdir(parents=True, exist_ok=True)
            probe = self.folder / ".writable"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            self._fail(f"cannot write the compiled decode cache ({e})")
            return False
        if not (self.folder / MARKER).is_file():
            messages.note(f"compiling the {self.dtype} decode step for this machine, once (about a minute)")
        # torch's C++ builder warns on stderr, outside ffai's messages, that it found no CUDA runtime.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        # Inductor reads its cache folder from the environment at each use; this process is the
        # text tower's, and nothing else in it compiles.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.folder / "inductor")
        self.steps = []
        for start, end, traces in runs(self.text.layers):
            span = LayerSpan(self.text.layers[start:end])
            self.steps.append((start, end, torch.compile(span, fullgraph=True, dynamic=False) if traces else span))
        return True

    def _fail(self, why: str) -> None:
        """Warn once and keep to the eager step from now on."""
        messages.warn(f"{why}; the {self.dtype} decode step runs uncompiled")
        self.failed = True
        self.steps = None


def attach(text: TextModel, weights: list[Path], dtype: str) -> None:
    """Give ``text`` the compiled decode step for ``dtype``, compiled on its first call."""
    text.compiled_decode = CompiledDecode(text, cache_dir(weights, dtype), dtype)
