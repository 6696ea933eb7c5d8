"""int8's or bfloat16's decode step as one AOTInductor program (opt-in: ``--compile``,
``RuntimeOptions.compile``), compiled once per machine into a package under ffai's home and loaded
from it by later processes.

:class:`FrozenStep` is the whole step for one token: every decoder layer as :func:`layer_step`
(the position a tensor, the key and value written into the caches in place, attention over the
caches' filled prefix in inductor's own loops, the prefix's length read from the position), the
final norm and the LM head. It is exported with the caches' length dynamic, so one program serves
every step and every cache size, and compiled by ``torch._inductor.aoti_compile_and_package``:
inductor's C++ wrapper calls the kernels with no Python between them, and fuses the norms, RoPE
and residual additions, which then round a little otherwise than eager's
(docs/precision-and-speed.md, "Compiled decode").

Its int8 linears (:class:`FrozenLinear`) multiply a decode row by the kernel
``ffai.kit.linear_kinds.compiled_row_kernel`` picks for torch's thread count and the CPU. At two threads or more
on CPUs without AMX, float32 sums of the int8 weight times the float32 row in inductor's own loops
(``"sums"``): no call leaves the program, so no thread waits while another runs a call's serial
part, no packed copy of the weights is made, and the row keeps float32. At one thread, where the
step is compute-bound, and on AMX CPUs, whose cores ran those loops slower than fbgemm at any
count, fbgemm's int8 dot products (``"fbgemm"``): the row quantised to 8 bits by its own range
(:func:`int8_row_fbgemm`, an op of ffai's torch library, since export cannot trace into
fbgemm's packed matrix), the model's int8 weight packed for it at load. oneDNN's packed bfloat16
layers (the plan's wide first layers) become float32 sums of their unpacked bfloat16 weight times
the float32 row, one loop inductor writes: a bfloat16 ``mm`` repacked the weight at every call, and
rounded the row and the sums to bfloat16 (docs/benchmarks.md). bfloat16's step is the same
program over its tower: every packed bfloat16 linear so, the first four layers' float32 linears
as float32 sums. The package cannot read oneDNN's reordered weights, so each of those layers
then holds the plain weight the package reads (``PackedBf16Linear.hold_plain``), and gets its
reordered one back where the step fails. The step is built only where the plan's text linears
are int8 by row with bfloat16 rows, or oneDNN's packed bfloat16 (CPUs with native bfloat16). The
package holds no weights (``package_constants_in_so=False``): after loading, the step's tensors
are handed to it (``user_managed``: shared, not copied). Where its LM head is fbgemm's, the
prefill's last row takes that head too, so the head's int8 weights are held once.

:class:`CompiledDecode` owns the package's folder (:func:`cache_dir`: keyed by the weight files'
sha256, the dtype, torch's version, the CPU's flags, the thread count and this module's source),
the one-time compile with its progress line, and the fallback: a folder that cannot be written, a
package that cannot be read, or a compile that fails leaves the eager step with one warning.
float32 never comes here: its eager path is the exact one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ffai import messages
from ffai.kit import host
from ffai.kit.linear_kinds import compiled_row_kernel
from ffai.kit.opt_in_linears import PackedBf16Linear, QuantizedLinear, RowScaledLinear, quantize_rows, row_scales
from ffai.kit.rope import apply_rope
from ffai.kit.text_tower import DecoderLayer, KVCache, TextModel
from ffai.models import ffai_home
from ffai.models.verification import sha256_file

DTYPES = ("int8", "bfloat16")  # the dtypes with a compiled step (docs/precision-and-speed.md, "Compiled decode")
PACKAGE = "decode.pt2"
HASHES = "sha256.json"  # ffai home's record of local weight files' sha256, by their inode and times
_SHA256 = re.compile(r"[0-9a-f]{64}")


def layer_step(layer: nn.Module, x, pos, end, cos, sin, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """``layer`` on the (1, 1, D) hidden state of the token at ``pos`` ((1,) long): its key and
    value written into the caches at ``pos``, attention over the filled prefix, the ``end`` =
    pos + 1 positions. ``cos``/``sin`` are the RoPE rows at ``pos`` ((1, hd) each)."""
    attn, mlp = layer.self_attn, layer.mlp
    h, kv, hd = attn.n_heads, attn.n_kv, attn.head_dim
    qkv = attn.qkv.forward(layer.input_layernorm.forward(x)).view(1, 1, h + 2 * kv, hd)
    q, k = apply_rope(qkv[:, :, : h + kv].transpose(1, 2), cos, sin).split([h, kv], dim=1)  # (1, H | Hkv, 1, hd)
    v = qkv[:, :, h + kv :].transpose(1, 2)  # (1, Hkv, 1, hd)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    # The prefix alone, not the whole cache masked: a cache is rounded up to 256 positions. The
    # attention in inductor's loops, each key head read once for its group of query heads: torch's
    # SDPA for one row ran MKL's generic gemv on AMD CPUs, several times the caches' floor.
    keys, values = k_cache[0, :, :end], v_cache[0, :, :end]  # (Hkv, end, hd)
    queries = realized(q.reshape(h, hd)).view(kv, h // kv, 1, hd)  # query head i reads key head i // group
    scores = (queries * keys[:, None]).sum(-1) * hd**-0.5  # (Hkv, group, end)
    y = (torch.softmax(scores, dim=-1)[..., None] * values[:, None]).sum(-2)  # (Hkv, group, hd)
    x = x + attn.o_proj.forward(y.reshape(1, 1, h * hd))
    return x + mlp.forward(layer.post_attention_layernorm.forward(x))


def realized(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied by a scatter, which inductor stores once rather than inlines into its readers:
    inlined, a norm or RoPE was computed again for every output a reader sums (docs/benchmarks.md)."""
    flat = t.reshape(-1, t.shape[-1])
    rows = torch.arange(flat.shape[0], device=flat.device)
    return flat.new_zeros(flat.shape).index_copy(0, rows, flat).view(t.shape)


# fbgemm's int8 kernel for float rows, as an opaque op of this library: torch.export cannot trace
# into aten's entry point (it reads the packed matrix), and an op defined here with a plain CPU
# kernel spares the package torch.library.custom_op's wrapper at every call (docs/benchmarks.md).
_LIBRARY = torch.library.Library("ffai", "DEF")
_LIBRARY.define("int8_row_fbgemm(Tensor x, Tensor packed, Tensor offsets, Tensor zero) -> Tensor")
# aten's legacy fbgemm entry points warn at each call that they are deprecated.
warnings.filterwarnings("ignore", message=r"fbgemm_\w+ is deprecated")


def int8_row_fbgemm(x: torch.Tensor, packed, offsets, zero) -> torch.Tensor:
    """Float rows times an int8 weight ``packed`` by fbgemm (``offsets`` its rows' sums, ``zero`` a
    zero per output) by fbgemm's int8 kernel, the rows quantised to 8 bits by their range; the
    sums unscaled."""
    # The entry point reads its unpacked weight argument for the shape alone: a one-byte stand-in
    # of that shape, so the plain weight need not be held beside the packed one.
    shape = torch.zeros((), dtype=torch.int8).expand(offsets.shape[0], x.shape[-1])
    return torch.fbgemm_linear_int8_weight_fp32_activation(x, shape, packed, offsets, 1.0, 0, zero)


_LIBRARY.impl("int8_row_fbgemm", int8_row_fbgemm, "CPU")
torch.library.register_fake(
    "ffai::int8_row_fbgemm",
    lambda x, packed, offsets, zero: x.new_empty(x.shape[0], offsets.shape[0]),
    lib=_LIBRARY,
)


def fbgemm_pack(weight: torch.Tensor) -> torch.Tensor:
    """fbgemm's packed copy of an (out, in) int8 weight, in a tensor that holds it opaquely."""
    with warnings.catch_warnings():  # deprecated, as the kernel's entry point
        warnings.simplefilter("ignore")
        return torch.fbgemm_pack_quantized_matrix(weight)


def row_sums(weight: torch.Tensor, rows: int = 4096) -> torch.Tensor:
    """The int32 sums of an (out, in) int8 weight's rows, a block of rows at a time: a sum in int32
    casts its operand first, and the LM head's whole weight cast at once raised the load's peak
    (docs/benchmarks.md, "The compiled int8 step's build, a load-time peak")."""
    return torch.cat([block.sum(1, dtype=torch.int32) for block in weight.split(rows)])


class FrozenLinear(nn.Module):
    """One linear of the step, its weights buffers the package takes as constants: int8 by row
    (``RowScaledLinear``'s own tensors, or fbgemm's unpacked: the same symmetric int8) times a row
    by fbgemm's kernel (``kernel="fbgemm"``: its packed copy made here, and held alone) or as a
    bfloat16 row by ``torch._weight_int8pack_mm`` (``"int8pack"``, as ``RowScaledLinear``
    multiplies one row) or as float32 sums of the int8 weight times the float32 row (``"sums"``:
    no packed copy and no 8-bit row); bfloat16 (oneDNN's packed weight, which the layer then holds
    plain) or float32 times the float32 row, summed in float32."""

    def __init__(self, linear: nn.Module, kernel: str = "int8pack") -> None:
        super().__init__()
        if isinstance(linear, RowScaledLinear):
            self.kind = "int8"
            self.register_buffer("weight", linear.int8_weight)
            self.register_buffer("scale", linear.scale)
            bias = linear.bias
        elif isinstance(linear, QuantizedLinear):
            self.kind = "int8"
            qweight, bias = torch.ops.quantized.linear_unpack(linear.packed)
            if bool(qweight.q_per_channel_zero_points().any()):
                raise ValueError("an int8 weight with zero points")
            self.register_buffer("scale", qweight.q_per_channel_scales().float())
            self.register_buffer("weight", qweight.int_repr().contiguous())
            del qweight  # the unpacked copy gone before any packing: one head's size off the load's peak
        elif isinstance(linear, PackedBf16Linear) and kernel == "fbgemm-wide":  # int8 by row for a row
            self.kind = "int8"
            dense = linear.dense_weight().float()
            self.register_buffer("scale", row_scales(dense))
            self.register_buffer("weight", quantize_rows(dense, self.scale))
            bias = linear.bias
        elif isinstance(linear, PackedBf16Linear):
            self.kind = "bf16"
            # Shared: the layer holds the plain weight from now on, each reordered copy dropped as
            # its layer is taken, so the tower's weights are never held twice.
            self.register_buffer("weight", linear.hold_plain())
            bias = linear.bias
        elif isinstance(linear, nn.Linear) and linear.weight.dtype == torch.float32:  # bfloat16's wide layers
            self.kind = "float32"
            self.register_buffer("weight", linear.weight.detach())
            bias = linear.bias
        else:
            raise TypeError(f"no compiled decode step for a {type(linear).__name__}")
        if self.kind == "int8" and kernel in ("fbgemm", "fbgemm-wide"):
            self.kind = "fbgemm"
            weight = self.weight
            del self.weight  # fbgemm reads its packed copy alone
            self.register_buffer("packed", fbgemm_pack(weight))
            self.register_buffer("offsets", row_sums(weight))
            self.register_buffer("zero", torch.zeros(weight.shape[0]))
        elif self.kind == "int8" and kernel == "sums":
            self.kind = "sums"
        elif self.kind == "int8":
            self.register_buffer("unit", torch.ones(self.weight.shape[0], dtype=torch.bfloat16))
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.out_features, self.in_features = linear.out_features, linear.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.kind == "fbgemm":
            y = torch.ops.ffai.int8_row_fbgemm(rows.float(), self.packed, self.offsets, self.zero)
            y = y * self.scale
        elif self.kind == "int8":
            y = torch._weight_int8pack_mm(rows.to(torch.bfloat16), self.weight, self.unit).float() * self.scale
        elif self.kind == "sums":
            y = (realized(rows)[:, None, :] * self.weight).sum(-1) * self.scale
        else:  # each output a float32 sum of bfloat16 weights times the float32 row, fused into one loop
            y = (realized(rows)[:, None, :] * self.weight).sum(-1)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], y.shape[-1])


# The kernels every int8 linear of the step takes, the LM head's too; the others are the MLPs' alone.
WHOLE_STEP_KERNELS = ("fbgemm", "fbgemm-wide", "sums")


class _FrozenMLP(nn.Module):
    def __init__(self, mlp, kernel: str) -> None:
        super().__init__()
        kernel = kernel if kernel in WHOLE_STEP_KERNELS else "fbgemm" if kernel == "fbgemm-mlp" else "int8pack"
        self.gate_up, self.down_proj = FrozenLinear(mlp.gate_up, kernel), FrozenLinear(mlp.down_proj, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up.forward(x).chunk(2, dim=-1)
        return self.down_proj.forward(F.silu(gate) * up)


class _FrozenAttention(nn.Module):
    def __init__(self, attn, kernel: str) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = attn.n_heads, attn.n_kv, attn.head_dim
        kernel = kernel if kernel in WHOLE_STEP_KERNELS else "int8pack"
        self.qkv, self.o_proj = FrozenLinear(attn.qkv, kernel), FrozenLinear(attn.o_proj, kernel)


class _FrozenLayer(nn.Module):
    """A decoder layer with :class:`FrozenLinear` linears, for :func:`layer_step`."""

    def __init__(self, layer: DecoderLayer, kernel: str) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
        self.self_attn, self.mlp = _FrozenAttention(layer.self_attn, kernel), _FrozenMLP(layer.mlp, kernel)


class FrozenStep(nn.Module):
    """The decode step, every layer and the final norm, as one module whose weights are buffers:
    (1, 1, D) embedding, position, RoPE rows, caches -> (1, 1, D) normed hidden state; with
    ``head``, the LM head too -> (1, vocab) logits."""

    def __init__(self, text: TextModel, head: bool = False, kernel: str = "int8pack") -> None:
        super().__init__()
        # The head first: the temporaries of its 49k rows are gone before the layers' copies pile up.
        self.lm_head = (
            FrozenLinear(text.lm_head, kernel if kernel in WHOLE_STEP_KERNELS else "int8pack") if head else None
        )
        self.layers = nn.ModuleList(_FrozenLayer(layer, kernel) for layer in text.layers)
        self.norm = text.norm

    def forward(self, x, pos, cos, sin, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
        end = pos[0].item() + 1  # exported as a size the caches bound
        torch._check(end >= 1)
        torch._check(end <= ks[0].shape[2])
        for layer, k, v in zip(self.layers, ks, vs):
            x = layer_step(layer, x, pos, end, cos, sin, k, v)
        x = self.norm.forward(x)
        return x if self.lm_head is None else self.lm_head.forward(x)[:, -1]


def unsupported(text: TextModel, dtype: str = "int8") -> str | None:
    """Why the step is not compiled for ``text`` in ``dtype``, or None where it is: the plan's
    text linears must be int8 by row with bfloat16 rows, or oneDNN's packed bfloat16 (native
    bfloat16), the plans the step's agreement was measured on; others keep the eager step. A tower
    that normalises q and k per head is not compiled: its step's agreement is not measured."""
    if text.cfg.qk_norm:
        return "this text tower normalises q and k per head, which the compiled step does not"
    if dtype == "bfloat16":  # its later layers' linears oneDNN's packed bfloat16 (native bfloat16)
        if not any(isinstance(m, PackedBf16Linear) for m in text.modules()):
            return "this CPU has no native bfloat16, and its bfloat16 plan multiplies otherwise than the compiled step"
        if not any(isinstance(m, PackedBf16Linear) for m in text.layers.modules()):
            return f"this model's {len(text.layers)} text layers all stay float32, so nothing is compiled"
        return None
    rows = [m for m in text.modules() if isinstance(m, RowScaledLinear)]
    if not rows:  # a small model: every text layer among the first four, held wider
        return f"this model's {len(text.layers)} text layers all stay wider than int8, so nothing is compiled"
    if not all(m.rows_dtype == torch.bfloat16 for m in rows):
        return "this CPU has no native bfloat16, and its int8 plan multiplies rows otherwise than the compiled step"
    return None


def weight_sha256(path: Path) -> str:
    """The file's sha256: a hub cache's blob is named by it (ffai models pull checked it); another
    file is hashed once and recorded under ffai's home by its device, inode, size and change time
    (which any write to the file moves), so a start does not read a gigabyte again."""
    real = path.resolve()
    if real.parent.name == "blobs" and _SHA256.fullmatch(real.name):
        return real.name
    st = real.stat()
    stamp = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    record_path = ffai_home() / "compiled" / HASHES
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = {}
    if isinstance(record.get(str(real)), dict) and record[str(real)].get("stamp") == stamp:
        return record[str(real)]["sha256"]
    record[str(real)] = {"stamp": stamp, "sha256": sha256_file(real)}
    try:  # only a later start's time depends on it
        record_path.parent.mkdir(parents=True, exist_ok=True)
        _replace_text(record_path, json.dumps(record, indent=1) + "\n")
    except OSError:
        pass
    return record[str(real)]["sha256"]


def _replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (another process may read it meanwhile)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_dir(weights: list[Path], dtype: str) -> Path:
    """The folder for one checkpoint's compiled step in ``dtype`` on this machine and torch, at
    torch's thread count: inductor writes it into the package's loops (one thread: none parallel)."""
    identity: list = [dtype, torch.__version__, sorted(host.cpu_info().flags), torch.get_num_threads()]
    identity.append(hashlib.sha256(Path(__file__).read_bytes()).hexdigest())  # the step's code
    identity += [weight_sha256(path) for path in weights]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    return ffai_home() / "compiled" / f"decode-{dtype}-{key}"


def export_step(step: FrozenStep, x, pos, cos, sin, cache: KVCache) -> torch.export.ExportedProgram:
    """``step`` exported at one token, the caches' length (dim 2) dynamic."""
    length = torch.export.Dim("length", min=2, max=1 << 20)
    ks, vs = list(cache.k), list(cache.v)
    dynamic = {"x": None, "pos": None, "cos": None, "sin": None}
    dynamic |= {"ks": [{2: length}] * len(ks), "vs": [{2: length}] * len(vs)}
    return torch.export.export(step, (x, pos, cos, sin, ks, vs), dynamic_shapes=dynamic)


class CompiledDecode:
    """int8's or bfloat16's decode step for one text tower as an AOTInductor package in ``folder``, compiled
    there by :meth:`prepare` (or the first call) where no package is. A call returns the logits, or None where there is
    no compiled step (the caller then takes the eager step); the reason is warned once."""

    def __init__(self, text: TextModel, folder: Path, dtype: str, head: bool = True, kernel: str | None = None) -> None:
        self.text, self.folder, self.dtype = text, folder, dtype
        # What ships is the default (sums or fbgemm by the thread count and CPU); the others are levers the
        # bench measures beside it: the LM head eager's, the int8 linears' one-row kernel int8pack (all)
        # or fbgemm-mlp (the MLPs only), or fbgemm-wide (the wide bfloat16 layers int8 too, for a row).
        self.head = head
        self.kernel = kernel or compiled_row_kernel(torch.get_num_threads(), host.cpu_info().flags)
        self.runner = None
        self.failed = False
        self.load_s: float | None = None  # the package's load, for the bench
        self._slots = torch.arange(0)

    def __call__(self, x: torch.Tensor, slot: int, rope: tuple, cache: KVCache) -> torch.Tensor | None:
        """(1, 1, D) embedding of the token written at cache ``slot`` with its RoPE rows ``rope``
        ((1, hd) cos and sin) -> (1, vocab) logits, or None."""
        if self.failed or x.shape[0] != 1:
            return None
        if self.runner is None and not self.prepare():
            return None
        if self._slots.shape[0] <= slot:  # every slot a cache can have, built once rather than a tensor a step
            self._slots = torch.arange(max(cache.max_len, slot + 1))
        pos = self._slots[slot : slot + 1]
        (out,) = self.runner.boxed_run([x, pos, *rope, *cache.k, *cache.v])  # FrozenStep's inputs, flat
        return out if self.head else self.text.lm_head.forward(out)[:, -1]

    def prepare(self) -> bool:
        """The package loaded (compiled first where it is not there yet); False (warned) where not."""
        if self.runner is not None or self.failed:
            return not self.failed
        # torch's C++ builder warns on stderr, outside ffai's messages, that it found no CUDA runtime.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        why = unsupported(self.text, self.dtype)
        if why is not None:
            return self._fail(why)
        package = self.folder / PACKAGE
        # Packing for fbgemm goes through buffers freed as each layer is done: a load's heap
        # settings hand them back at once, instead of leaving them in the heap.
        with host.heap_for_loading():
            step = FrozenStep(self.text, self.head, self.kernel).eval()
        if not package.is_file():
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                probe = self.folder / ".writable"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as e:
                return self._fail(f"cannot write the compiled decode cache ({e})")
            messages.note(f"compiling the {self.dtype} decode step for this machine, once (a minute or two)")
            try:
                self._compile(step, package)
            except Exception as e:  # noqa: BLE001 - any failure of the compiler leaves the eager step
                return self._fail(f"could not compile the decode step ({type(e).__name__}: {_first_line(e)})")
        try:
            start = time.perf_counter()
            # The package's C++ loader itself: torch._inductor.aoti_load_package's wrapper imports
            # inductor (a large share of a warm start: docs/benchmarks.md) and parses the call's tree at each step.
            runner = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
            constants = {**dict(step.named_buffers()), **dict(step.named_parameters())}
            wanted = {name: constants[name] for name in runner.get_constant_fqns()}
            runner.load_constants(wanted, False, True, True, False)  # active buffer, all checked, user-managed
            self.load_s = time.perf_counter() - start
        except Exception as e:  # noqa: BLE001 - a package torch cannot read leaves the eager step
            return self._fail(
                f"could not load the compiled decode step {package} ({type(e).__name__}: {_first_line(e)})"
            )
        self.runner, self._step = runner, step  # the step keeps the constants the runner points at
        if (
            isinstance(self.text.lm_head, QuantizedLinear)
            and step.lm_head is not None
            and step.lm_head.kind == "fbgemm"
        ):
            # The prefill's last row takes the step's LM head too: the same int8 weight, quantised
            # row and fbgemm kernel, and one packed copy of the 49k rows held instead of two.
            self.text.lm_head = step.lm_head
        return True

    def _compile(self, step: FrozenStep, package: Path) -> None:
        """Export and compile ``step`` into ``package``, whole or not at all, at example inputs of
        its shapes. Inductor's work files go to a folder beside it, removed after."""
        import torch._inductor  # only a compile pays for its import

        text = self.text
        x = torch.zeros(1, 1, text.cfg.hidden_size, dtype=text.dtype)
        cos, sin = text.rope_rows(0, 1)
        _thread_lock_for_progress_bars()
        work = Path(tempfile.mkdtemp(dir=self.folder, prefix=".build-"))
        saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")  # read at each use
        try:
            with torch.no_grad():
                program = export_step(step, x, torch.zeros(1, dtype=torch.long), cos, sin, text.new_cache(1, 16))
            options = {"aot_inductor.package_constants_in_so": False}
            built = torch._inductor.aoti_compile_and_package(
                program, package_path=str(work / PACKAGE), inductor_configs=options
            )
            os.replace(built, package)
        finally:
            if saved is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
            shutil.rmtree(work, ignore_errors=True)

    def _fail(self, why: str) -> bool:
        """Warn once and keep to the eager step from now on."""
        messages.warn(f"--compile: {why}; the {self.dtype} decode step runs uncompiled")
        self.failed = True
        for layer in self.text.modules():  # the eager step's one-row products want the reordered weights
            if isinstance(layer, PackedBf16Linear):
                layer.reorder()
        return False


def _thread_lock_for_progress_bars() -> None:
    """The compile shows tqdm bars (torch.fx's interpreter); tqdm's default lock holds a
    multiprocessing semaphore, which a pipeline worker, ending by os._exit, leaves for the
    resource tracker to warn of at exit. One process's bars need only a thread lock."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0]


def attach(text: TextModel, weights: list[Path], dtype: str) -> None:
    """Give ``text`` the compiled decode step for ``dtype``, loaded now (compiled first, once per
    machine), so the compile's note comes before any output; a dtype without one is warned of."""
    if dtype not in DTYPES:
        messages.warn(f"--compile: {dtype} has no compiled decode step (int8 has); it runs uncompiled")
        return
    text.compiled_decode = CompiledDecode(text, cache_dir(weights, dtype), dtype)
    text.compiled_decode.prepare()
