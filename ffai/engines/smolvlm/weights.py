"""Load an Idefics3 checkpoint from safetensors into :class:`Idefics3` (after gpt-fast's loader).

Safetensors only (never pickle), memory-mapped through ``safe_open``; the module is built on
the meta device and each parameter is assigned the checkpoint tensor (cast to the dtype and
device a :class:`~ffai.engines.smolvlm.precision.PrecisionPlan` says), so no random init runs and no
second copy is made for float32 on CPU. The plan decides; this module reads and applies it. A fused
parameter (``layers.FusedLinear``: q/k/v, gate/up) is one buffer that its checkpoint tensors
are read into, each at its rows: fusing is part of reading, with no copy after it.

Checkpoint names are mapped by one table, ``WEIGHT_NAMES``, with ``{}`` for the layer index.
These are the names of the hub checkpoint (saved by transformers 4.46) and also exactly what
transformers 5.24's ``Idefics3ForConditionalGeneration.save_pretrained`` writes (it has no key
conversion for Idefics3; checked by ``tests/test_smolvlm_config.py``). Both directions are
checked: every tensor in the files must map to a parameter, every parameter (every part of a
fused one) must be filled, shapes must agree; otherwise :class:`ModelError` names the tensor
and the file.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from ffai.errors import ModelError
from ffai.kit.opt_in_linears import OneDnnInt8Linear, PackedBf16Linear, QuantizedLinear, RowScaledLinear
from ffai.kit.tensor_files import FILE_DTYPES, RawHeader

from .config import ModelConfig
from .layers import FileEmbedding, FusedLinear
from .model import PARTS, Idefics3
from .precision import BF16_ONEDNN, FLOAT32, INT8, INT8_BY_ROW, INT8_ONEDNN, PLAIN, PrecisionPlan, plan_precision

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TIED_HEAD = "lm_head.weight"
EMBEDDINGS = "text.embed_tokens.weight"

# checkpoint name -> module name; "{}" is a layer index, "[i]" the i-th part of a fused parameter
# (its i-th block of rows). Biases a config turns off are simply absent from the module, so a
# checkpoint that has them fails the "every tensor used" check.
WEIGHT_NAMES: dict[str, str] = {
    "model.vision_model.embeddings.patch_embedding.weight": "vision.embeddings.patch_embedding.weight",
    "model.vision_model.embeddings.patch_embedding.bias": "vision.embeddings.patch_embedding.bias",
    "model.vision_model.embeddings.position_embedding.weight": "vision.embeddings.position_embedding.weight",
    "model.vision_model.encoder.layers.{}.layer_norm1.weight": "vision.layers.{}.layer_norm1.weight",
    "model.vision_model.encoder.layers.{}.layer_norm1.bias": "vision.layers.{}.layer_norm1.bias",
    "model.vision_model.encoder.layers.{}.self_attn.q_proj.weight": "vision.layers.{}.self_attn.qkv.weight[0]",
    "model.vision_model.encoder.layers.{}.self_attn.q_proj.bias": "vision.layers.{}.self_attn.qkv.bias[0]",
    "model.vision_model.encoder.layers.{}.self_attn.k_proj.weight": "vision.layers.{}.self_attn.qkv.weight[1]",
    "model.vision_model.encoder.layers.{}.self_attn.k_proj.bias": "vision.layers.{}.self_attn.qkv.bias[1]",
    "model.vision_model.encoder.layers.{}.self_attn.v_proj.weight": "vision.layers.{}.self_attn.qkv.weight[2]",
    "model.vision_model.encoder.layers.{}.self_attn.v_proj.bias": "vision.layers.{}.self_attn.qkv.bias[2]",
    "model.vision_model.encoder.layers.{}.self_attn.out_proj.weight": "vision.layers.{}.self_attn.out_proj.weight",
    "model.vision_model.encoder.layers.{}.self_attn.out_proj.bias": "vision.layers.{}.self_attn.out_proj.bias",
    "model.vision_model.encoder.layers.{}.layer_norm2.weight": "vision.layers.{}.layer_norm2.weight",
    "model.vision_model.encoder.layers.{}.layer_norm2.bias": "vision.layers.{}.layer_norm2.bias",
    "model.vision_model.encoder.layers.{}.mlp.fc1.weight": "vision.layers.{}.mlp.fc1.weight",
    "model.vision_model.encoder.layers.{}.mlp.fc1.bias": "vision.layers.{}.mlp.fc1.bias",
    "model.vision_model.encoder.layers.{}.mlp.fc2.weight": "vision.layers.{}.mlp.fc2.weight",
    "model.vision_model.encoder.layers.{}.mlp.fc2.bias": "vision.layers.{}.mlp.fc2.bias",
    "model.vision_model.post_layernorm.weight": "vision.post_layernorm.weight",
    "model.vision_model.post_layernorm.bias": "vision.post_layernorm.bias",
    "model.connector.modality_projection.proj.weight": "connector.modality_projection.proj.weight",
    "model.text_model.embed_tokens.weight": "text.embed_tokens.weight",
    "model.text_model.layers.{}.input_layernorm.weight": "text.layers.{}.input_layernorm.weight",
    "model.text_model.layers.{}.self_attn.q_proj.weight": "text.layers.{}.self_attn.qkv.weight[0]",
    "model.text_model.layers.{}.self_attn.q_proj.bias": "text.layers.{}.self_attn.qkv.bias[0]",
    "model.text_model.layers.{}.self_attn.k_proj.weight": "text.layers.{}.self_attn.qkv.weight[1]",
    "model.text_model.layers.{}.self_attn.k_proj.bias": "text.layers.{}.self_attn.qkv.bias[1]",
    "model.text_model.layers.{}.self_attn.v_proj.weight": "text.layers.{}.self_attn.qkv.weight[2]",
    "model.text_model.layers.{}.self_attn.v_proj.bias": "text.layers.{}.self_attn.qkv.bias[2]",
    "model.text_model.layers.{}.self_attn.o_proj.weight": "text.layers.{}.self_attn.o_proj.weight",
    "model.text_model.layers.{}.self_attn.o_proj.bias": "text.layers.{}.self_attn.o_proj.bias",
    "model.text_model.layers.{}.post_attention_layernorm.weight": "text.layers.{}.post_attention_layernorm.weight",
    "model.text_model.layers.{}.mlp.gate_proj.weight": "text.layers.{}.mlp.gate_up.weight[0]",
    "model.text_model.layers.{}.mlp.gate_proj.bias": "text.layers.{}.mlp.gate_up.bias[0]",
    "model.text_model.layers.{}.mlp.up_proj.weight": "text.layers.{}.mlp.gate_up.weight[1]",
    "model.text_model.layers.{}.mlp.up_proj.bias": "text.layers.{}.mlp.gate_up.bias[1]",
    "model.text_model.layers.{}.mlp.down_proj.weight": "text.layers.{}.mlp.down_proj.weight",
    "model.text_model.layers.{}.mlp.down_proj.bias": "text.layers.{}.mlp.down_proj.bias",
    "model.text_model.norm.weight": "text.norm.weight",
    "lm_head.weight": "text.lm_head.weight",
}


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{\}", r"(\d+)") + "$")


_TO_MODULE = [(_pattern(ckpt), module) for ckpt, module in WEIGHT_NAMES.items()]
_TO_CHECKPOINT = [(_pattern(module), ckpt) for ckpt, module in WEIGHT_NAMES.items()]


def _rename(name: str, table: list) -> str | None:
    for pattern, target in table:
        m = pattern.match(name)
        if m:
            return target.replace("{}", m.group(1)) if m.groups() else target
    return None


def module_name(checkpoint_name: str) -> str | None:
    """The parameter a checkpoint tensor fills, or None if the table has no entry for it."""
    return _rename(checkpoint_name, _TO_MODULE)


def checkpoint_name(module_param: str) -> str | None:
    return _rename(module_param, _TO_CHECKPOINT)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: the shards of an index, or the single file."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"{index}: not a valid safetensors index: {e}") from e
        files = [model_dir / name for name in names]
        for f in files:
            if not f.is_file():
                raise ModelError(f"{index}: lists shard {f.name}, which is missing")
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    others = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(p.name for p in model_dir.glob("*.pt*"))
    hint = f" (found {', '.join(others)}; pickle checkpoints are not loaded)" if others else ""
    raise ModelError(f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}{hint}")


class Slot(NamedTuple):
    """Where one checkpoint tensor goes: a parameter, or a block of its rows (``rows``)."""

    param: str
    rows: slice | None  # None: the whole parameter
    shape: tuple[int, ...]  # the checkpoint tensor's shape


def slots(model: Idefics3) -> dict[str, Slot]:
    """Every tensor a checkpoint must hold for ``model``, by module name (the table's values):
    a parameter of its own, or for a :class:`FusedLinear` each part as ``name[i]``."""
    out = {}
    # named_parameters lists a tied head once, as the embedding.
    for name, param in model.named_parameters():
        module = model.get_submodule(name.rpartition(".")[0])
        if isinstance(module, FusedLinear):
            for i, rows in enumerate(module.part_rows()):
                out[f"{name}[{i}]"] = Slot(name, rows, (rows.stop - rows.start, *param.shape[1:]))
        else:
            out[name] = Slot(name, None, tuple(param.shape))
    return out


def model_tensor(model: Idefics3, checkpoint_tensor: str) -> torch.Tensor:
    """The model's copy of a checkpoint tensor: its parameter, or its rows of a fused one."""
    slot = slots(model)[module_name(checkpoint_tensor)]
    param = model.get_parameter(slot.param)
    return param if slot.rows is None else param[slot.rows]


class _Reader:
    """Reads checkpoint files into a state dict for one model, checking names and shapes.

    ``expected`` are the slots of the full model: each tensor is checked against them, and only
    those filling a parameter in ``wanted`` are read into memory. The parts of a fused parameter
    are read from the file straight into their rows of one buffer, so nothing is concatenated
    afterwards; every other tensor stays a view of the memory-mapped file (pages are read when
    first used, and only those used: an embedding row). Reading a part through the map instead
    would leave its pages resident in this process beside the fused buffer: the q/k/v and
    gate/up weights, most of the model, twice over. For the same reason a tensor cast to
    another dtype (``plan.weights`` bfloat16) is read, not mapped. So is a tensor under
    ``MAP_MIN_BYTES``: the kernel fills a mapped file in large folios (up to 2 MB each on this
    machine's 6.18), and touching one norm's 2 KB brought its whole folio into the process; the
    int8 model's hundred-odd small float32 tensors held 125 MiB of the file resident that way.

    ``linears`` are the linear layers the plan holds as another layer (int8, bfloat16 for
    oneDNN: ``PrecisionPlan.linear``). Once such a layer has all its checkpoint tensors (the
    parts of a fused weight, its bias) it is built (``self.built``) and its float tensors are
    dropped, so at most a few layers' float weights are in memory at once. Those tensors are
    read, not mapped, for the same reason as above: a mapped page stays resident after the copy
    is made.
    """

    def __init__(
        self,
        expected: dict[str, Slot],
        wanted: dict[str, torch.Tensor],
        plan: PrecisionPlan,
        tied: bool,
        linears: dict[str, nn.Linear],
        float32: frozenset[str] = frozenset(),
    ) -> None:
        self.expected, self.wanted, self.plan, self.tied = expected, wanted, plan, tied
        self.dtype, self.device = plan.weights, plan.device
        self.float32 = float32  # parameters kept in float32 whatever ``dtype`` is
        self.state: dict[str, torch.Tensor] = {}
        self.seen: set[str] = set()
        self.linears = linears
        self.pending: dict[str, set[str]] = {name: set() for name in self.linears}  # layer -> slots it waits for
        for target, slot in expected.items():
            layer = slot.param.rpartition(".")[0]
            if layer in self.pending and slot.param in wanted:
                self.pending[layer].add(target)
        self.built: dict[str, nn.Module] = {}
        self.embeddings_at: tuple[Path, str] | None = None  # (file, tensor name) of the embedding table

    def read(self, path: Path) -> None:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt", device="cpu") as f, open(path, "rb") as raw:
                header = RawHeader(raw)
                for name in f.keys():
                    self._take(path, f, name, header)
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise ModelError(f"{path}: not a readable safetensors file: {e}") from e

    def _take(self, path: Path, f, name: str, header: "RawHeader") -> None:
        if self.tied and name == TIED_HEAD:
            return  # the head is the embedding matrix; a stored copy is redundant
        target = module_name(name)
        if target is None or target not in self.expected:
            raise ModelError(f"{path}: tensor {name} has no place in the model (unexpected tensor)")
        if target in self.seen:
            raise ModelError(f"{path}: tensor {name} appears twice in the checkpoint")
        self.seen.add(target)
        if target == EMBEDDINGS:
            self.embeddings_at = (path, name)
        slot = self.expected[target]
        found = tuple(f.get_slice(name).get_shape())
        if found != slot.shape:
            raise ModelError(f"{path}: tensor {name} has shape {list(found)}, expected {list(slot.shape)}")
        if slot.param not in self.wanted:
            return
        if slot.rows is not None:
            if slot.param not in self.state:
                self.state[slot.param] = self._empty(self.wanted[slot.param].shape, slot.param)
            header.read_into(name, self.state[slot.param][slot.rows], f)
        else:
            layer = slot.param.rpartition(".")[0]
            dtype = torch.float32 if slot.param in self.float32 else self.dtype
            mapped = (
                header.stored_as(name, dtype)
                and torch.device(self.device).type == "cpu"
                and math.prod(slot.shape) * dtype.itemsize >= MAP_MIN_BYTES
            )
            if mapped and layer not in self.pending:
                self.state[slot.param] = f.get_tensor(name)  # a view of the map: pages read when used
            else:  # cast, moved or quantised: read, not mapped, so no page stays behind
                self.state[slot.param] = header.read_into(name, self._empty(slot.shape, slot.param), f)
        self._build_when_complete(slot.param.rpartition(".")[0], target)

    def _build_when_complete(self, layer: str, target: str) -> None:
        waiting = self.pending.get(layer)
        if waiting is None:
            return
        waiting.discard(target)
        if not waiting:
            del self.pending[layer]
            weight = self.state.pop(f"{layer}.weight")
            bias = self.state.pop(f"{layer}.bias", None)
            parts = getattr(self.linears[layer], "parts", ())
            self.built[layer] = opt_in_linear(self.plan, layer, weight, bias, parts)

    def _empty(self, shape, param: str) -> torch.Tensor:
        dtype = torch.float32 if param in self.float32 else self.dtype
        return torch.empty(shape, dtype=dtype, device=self.device)

    def missing(self) -> list[str]:
        return [checkpoint_name(target) or target for target in self.expected if target not in self.seen]


# Tensors smaller than this are read, not mapped (see _Reader): a copy costs its own size, a
# mapping up to a large folio of the file (2 MB) around it.
MAP_MIN_BYTES = 4 << 20


def opt_in_linear(plan: PrecisionPlan, name: str, weight: torch.Tensor, bias, parts: tuple[int, ...]) -> nn.Module:
    """The layer ``plan`` makes of the linear ``name`` from its float weight and bias."""
    kind = plan.linear(name)
    if kind == INT8:
        return QuantizedLinear(weight, bias, reduce_range=plan.int8.reduce_range, parts=parts)
    if kind == INT8_ONEDNN:
        return OneDnnInt8Linear(weight, bias, parts)
    if kind == INT8_BY_ROW:
        int8 = plan.int8
        return RowScaledLinear(weight, bias, rows_dtype=int8.rows_dtype, int_mm=not int8.reduce_range, parts=parts)
    if kind == BF16_ONEDNN:
        return PackedBf16Linear(weight, bias, parts)
    raise ValueError(f"{name}: no layer to build for a linear held as {kind!r}")


def kept_in_float32(model: Idefics3, plan: PrecisionPlan) -> frozenset[str]:
    """The parameters ``plan`` keeps in float32 whatever ``plan.weights`` is: those of its
    ``float32_parts`` other than linear weights (``--dtype bfloat16``: the text tower's
    embedding table and RMSNorm weights), and the linears it holds as ``FLOAT32``. The embedding
    table is mapped, not read, so keeping it float32 costs only the rows a prompt looks up."""
    kept = {
        f"{name}.{p}"
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and plan.linear(name) == FLOAT32
        for p, _ in m.named_parameters()
    }
    for part in plan.float32_parts:
        tower = getattr(model, part)
        if tower is None:
            continue
        linear = {f"{part}.{n}.weight" for n, m in tower.named_modules() if isinstance(m, nn.Linear)}
        kept |= {f"{part}.{n}" for n, _ in tower.named_parameters()} - linear
    return frozenset(kept)


def _read_tensor(at: tuple[Path, str], into: torch.Tensor) -> torch.Tensor:
    """Tensor ``at`` = (file, name) read (cast to ``into``'s dtype) into ``into``, not through a map."""
    from safetensors import safe_open

    path, name = at
    with safe_open(str(path), framework="pt", device="cpu") as f, open(path, "rb") as raw:
        return RawHeader(raw).read_into(name, into, f)


def _embeddings_left_in_file(model: Idefics3, at: tuple[Path, str] | None) -> None:
    """The text tower's embedding table as a :class:`FileEmbedding`, where the plan says nothing
    else reads it whole (the LM head holds its own int8 or bfloat16 copy), so only a prompt's
    rows are ever read.
    Left mapped, the table's pages came into this process's memory as it touched them, and the
    kernel fills a mapped file in large folios (up to 2 MB) on this machine's kernel: 130 MiB of
    the int8 process's resident memory was the 113 MB table (``/proc/PID/smaps``)."""
    if model.text is None or at is None:
        return
    path, name = at
    with open(path, "rb") as raw:
        header = RawHeader(raw)
    entry, table = header.entries[name], model.text.embed_tokens.weight
    file_dtype = FILE_DTYPES.get(entry["dtype"])
    if file_dtype is None:
        return  # a dtype only safetensors reads: the table stays as loaded
    offset = header.data_start + entry["data_offsets"][0]
    model.text.embed_tokens = FileEmbedding(path, offset, tuple(table.shape), file_dtype, table.dtype)


def load_model(model_dir: Path | str, plan: PrecisionPlan | None = None, *, parts: tuple[str, ...] = PARTS) -> Idefics3:
    """Build :class:`Idefics3` from a checkpoint folder (config.json + safetensors), as ``plan``
    says (default: float32 on the CPU, the exact path).

    ``parts`` picks what to hold in memory ("vision", "text"); the whole checkpoint is checked
    either way, so a folder loads for one part exactly when it loads for all. Each linear layer
    becomes what ``plan.linear`` names (built as its tensors are read); a tied LM head held as
    another layer gets its own copy, read from the file.
    """
    plan = plan_precision("float32") if plan is None else plan
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    with torch.device("meta"):
        full = Idefics3(cfg)
        model = Idefics3(cfg, parts, plan.attention, plan.text_prefill)
    tie = cfg.tie_word_embeddings and "text" in model.parts
    head_kind = plan.linear("text.lm_head")
    linears = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and plan.linear(name) not in (PLAIN, FLOAT32)
        and not (tie and name == "text.lm_head")
    }
    reader = _Reader(
        slots(full),
        dict(model.named_parameters()),
        plan,
        cfg.tie_word_embeddings,
        linears,
        float32=kept_in_float32(model, plan),
    )
    for path in weight_files(model_dir):
        reader.read(path)
    missing = reader.missing()
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelError(f"{model_dir}: checkpoint is missing tensor(s) {shown}")
    state = reader.state
    if tie and head_kind != PLAIN:  # the head's own copy of the table, read from the file, not through the map
        head = _read_tensor(reader.embeddings_at, torch.empty(model.text.lm_head.weight.shape, dtype=plan.weights))
        reader.built["text.lm_head"] = opt_in_linear(plan, "text.lm_head", head, None, ())
        del head
        tie = False
    for name, layer in reader.built.items():
        model.set_submodule(name, layer)
    if tie:
        state["text.lm_head.weight"] = state["text.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    state.clear()
    if tie:
        model.text.lm_head.weight = model.text.embed_tokens.weight  # assign=True made two Parameters
    if plan.embeddings_in_file:
        _embeddings_left_in_file(model, reader.embeddings_at)
    return model.eval().requires_grad_(False)
