"""Loading a checkpoint from safetensors into an engine's model, as a precision plan says (after
gpt-fast's loader).

Safetensors only (never pickle). The model is built on the meta device and each parameter is
assigned the checkpoint's tensor, in the dtype and on the device the plan says, so no random init
runs and a float32 load on a CPU makes no second copy. An engine gives its model's builder and its
weight-name table (``ffai.kit.weight_names``); this module reads, checks and applies the plan.

Both directions are checked: every tensor in the files must map to a parameter of the model the
config describes, with its shape; every parameter (every part of a fused one) must be filled, or
a tied LM head by the embedding table. Each failure is one :class:`ModelError` line naming the
file and the tensor. A fused parameter (``linears.FusedLinear``: q/k/v, gate/up) is one buffer that
its checkpoint tensors are read into, each at its rows: fusing is part of reading, with no copy
after it. A linear the plan holds as another layer (int8, bfloat16 packed for oneDNN) is built as
soon as its tensors are read, so at most a few layers' float weights are in memory at once.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import nn

from ffai.errors import ModelError
from ffai.kit import host
from ffai.kit.linear_kinds import FLOAT32, PLAIN
from ffai.kit.linears import FileEmbedding, FusedLinear
from ffai.kit.precision import PrecisionPlan, opt_in_linear
from ffai.kit.tensor_files import FILE_DTYPES, RawHeader
from ffai.kit.weight_names import EMBEDDINGS, HEAD, WeightNames

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors smaller than this are read, not mapped (see _Reader): a copy costs its own size, a
# mapping up to a large folio of the file around it.
MAP_MIN_BYTES = 4 << 20


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: the shards of an index (each must exist and
    hold exactly the tensors the index places there), or the single file."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise ModelError(f"{index}: cannot read the shard index: {e}") from e
        shards = sorted(set(weight_map.values()))
        for shard in shards:  # every shard there before any is read
            if Path(shard).name != shard or not (model_dir / shard).is_file():
                raise ModelError(f"{model_dir / shard}: shard missing (named by {INDEX_FILE})")
        files = [model_dir / shard for shard in shards]
        for path in files:
            names, listed = set(_keys(path)), {n for n, s in weight_map.items() if s == path.name}
            if listed - names:
                raise ModelError(f"{path}: lacks tensor {sorted(listed - names)[0]} that {INDEX_FILE} places there")
            if names - listed:
                raise ModelError(f"{path}: holds tensor {sorted(names - listed)[0]} that {INDEX_FILE} does not list")
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    others = sorted(p.name for p in model_dir.glob("*.bin")) + sorted(p.name for p in model_dir.glob("*.pt*"))
    hint = f" (found {', '.join(others)}; pickle checkpoints are not loaded)" if others else ""
    raise ModelError(f"{model_dir}: no {SINGLE_FILE} and no {INDEX_FILE}{hint}")


def _keys(path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return list(f.keys())
    except Exception as e:  # safetensors raises its own error types for a damaged header
        raise ModelError(f"{path}: not a readable safetensors file: {e}") from e


class Slot(NamedTuple):
    """Where one checkpoint tensor goes: a parameter, or a block of its rows (``rows``)."""

    param: str
    rows: slice | None  # None: the whole parameter
    shape: tuple[int, ...]  # the checkpoint tensor's shape


def slots(model: nn.Module) -> dict[str, Slot]:
    """Every tensor a checkpoint must hold for ``model``, by module name (a weight-name table's
    values): a parameter of its own, or for a :class:`FusedLinear` each part as ``name[i]``."""
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


def model_tensor(model: nn.Module, names: WeightNames, checkpoint_tensor: str) -> torch.Tensor:
    """The model's copy of a checkpoint tensor: its parameter, or its rows of a fused one."""
    slot = slots(model)[names.module_name(checkpoint_tensor)]
    param = model.get_parameter(slot.param)
    return param if slot.rows is None else param[slot.rows]


def check_tensors(model_dir: Path, full: nn.Module, names: WeightNames, tied: bool) -> None:
    """Every tensor of the checkpoint's files maps to a parameter of ``full`` (a meta-device model
    of every part) with its shape, and every parameter is there, reading headers only: a folder
    that would fail to load fails here, before any weight is read."""
    from safetensors import safe_open

    expected, seen = slots(full), set()
    head = names.checkpoint_name(f"{HEAD}.weight")
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if tied and name == head:
                    continue
                seen.add(_expected_slot(path, name, tuple(f.get_slice(name).get_shape()), expected, names, seen))
    _check_complete(model_dir, expected, seen, names)


def _expected_slot(path: Path, name: str, shape: tuple, expected: dict[str, Slot], names: WeightNames, seen) -> str:
    target = names.module_name(name)
    if target is None or target not in expected:
        raise ModelError(f"{path}: tensor {name} has no place in the model (unexpected tensor)")
    if target in seen:
        raise ModelError(f"{path}: tensor {name} appears twice in the checkpoint")
    if shape != expected[target].shape:
        raise ModelError(f"{path}: tensor {name} has shape {list(shape)}, expected {list(expected[target].shape)}")
    return target


def _check_complete(model_dir: Path, expected: dict[str, Slot], seen: set[str], names: WeightNames) -> None:
    missing = [names.checkpoint_name(t) or t for t in expected if t not in seen]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelError(f"{model_dir}: checkpoint is missing tensor(s) {shown}")


def param_dtypes(model: nn.Module, plan: PrecisionPlan) -> dict[str, torch.dtype]:
    """Each parameter's dtype under ``plan``: float32 for a linear it holds as ``FLOAT32`` and,
    in its ``float32_parts``, for everything but linears and convolutions (norms, position
    tables, so the residual streams stay float32); ``plan.embeddings`` for the token embedding
    table; ``plan.weights`` for the rest."""
    out = {}
    for name, module in model.named_modules():
        for p, _ in module.named_parameters(recurse=False):
            full = f"{name}.{p}"
            if isinstance(module, nn.Linear) and plan.linear(name) == FLOAT32:
                out[full] = torch.float32
            elif full == EMBEDDINGS:
                out[full] = plan.embeddings
            elif isinstance(module, (nn.Linear, nn.Conv2d, nn.Conv3d)):
                out[full] = plan.weights
            else:
                out[full] = torch.float32 if name.split(".")[0] in plan.float32_parts else plan.weights
    return out


class _Reader:
    """Reads checkpoint files into a state dict for one model, checking names and shapes.

    ``expected`` are the slots of the full model: each tensor is checked against them, and only
    those filling a parameter in ``wanted`` are read into memory. The parts of a fused parameter
    are read from the file straight into their rows of one buffer, so nothing is concatenated
    afterwards; every other tensor stays a view of the memory-mapped file (pages are read when
    first used, and only those used: an embedding row). Reading a part through the map instead
    would leave its pages resident in this process beside the fused buffer: the q/k/v and
    gate/up weights, most of the model, twice over. For the same reason a tensor cast to
    another dtype is read, not mapped. So is a tensor under ``MAP_MIN_BYTES``: the kernel fills a
    mapped file in large folios, and touching one norm's few kilobytes brought its whole folio
    into the process (docs/benchmarks.md).

    ``linears`` are the linear layers the plan holds as another layer (int8, bfloat16 for
    oneDNN: ``PrecisionPlan.linear``). Once such a layer has all its checkpoint tensors (the
    parts of a fused weight, its bias) it is built (``self.built``) and its float tensors are
    dropped. Those tensors are read, not mapped, for the same reason as above: a mapped page
    stays resident after the copy is made.
    """

    def __init__(
        self,
        expected: dict[str, Slot],
        wanted: dict[str, torch.Tensor],
        plan: PrecisionPlan,
        names: WeightNames,
        tied: bool,
        linears: dict[str, nn.Module],
        dtypes: dict[str, torch.dtype],
    ) -> None:
        self.expected, self.wanted, self.plan, self.names, self.tied = expected, wanted, plan, names, tied
        self.device, self.dtypes = plan.device, dtypes
        self.head = names.checkpoint_name(f"{HEAD}.weight")
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

    def _take(self, path: Path, f, name: str, header: RawHeader) -> None:
        if self.tied and name == self.head:
            return  # the head is the embedding matrix; a stored copy is redundant
        shape = tuple(f.get_slice(name).get_shape())
        target = _expected_slot(path, name, shape, self.expected, self.names, self.seen)
        self.seen.add(target)
        if target == EMBEDDINGS:
            self.embeddings_at = (path, name)
        slot = self.expected[target]
        if slot.param not in self.wanted:
            return
        if slot.rows is not None:
            if slot.param not in self.state:
                self.state[slot.param] = self._empty(self.wanted[slot.param].shape, slot.param)
            header.read_into(name, self.state[slot.param][slot.rows], f)
        else:
            layer = slot.param.rpartition(".")[0]
            dtype = self.dtypes[slot.param]
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
        return torch.empty(shape, dtype=self.dtypes[param], device=self.device)


def _read_tensor(at: tuple[Path, str], into: torch.Tensor) -> torch.Tensor:
    """Tensor ``at`` = (file, name) read (cast to ``into``'s dtype) into ``into``, not through a map."""
    from safetensors import safe_open

    path, name = at
    with safe_open(str(path), framework="pt", device="cpu") as f, open(path, "rb") as raw:
        return RawHeader(raw).read_into(name, into, f)


def _embeddings_left_in_file(model: nn.Module, at: tuple[Path, str] | None) -> None:
    """The text tower's embedding table as a :class:`FileEmbedding`, where the plan says nothing
    else reads it whole (the LM head holds its own int8 or bfloat16 copy), so only a prompt's
    rows are ever read. Left mapped, the table's pages came into this process's memory as it
    touched them, a large folio at a time (docs/benchmarks.md)."""
    if getattr(model, "text", None) is None or at is None:
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


def load_model(
    model_dir: Path | str,
    build: Callable[[tuple[str, ...] | None], nn.Module],
    names: WeightNames,
    plan: PrecisionPlan,
    *,
    tied: bool,
    parts: tuple[str, ...] | None = None,
) -> nn.Module:
    """The model ``build(parts)`` makes (on the meta device here; ``None``: every part), filled from
    the checkpoint folder's safetensors as ``plan`` says.

    The whole checkpoint is checked whatever ``parts`` holds, so a folder loads for one part exactly
    when it loads for all. Each linear becomes what ``plan.linear`` names (built as its tensors
    are read); a tied LM head held as another layer gets its own copy, read from the file. A load
    that converts its weights reads them through staging buffers, under glibc's heap settings for
    that (``host.heap_for_loading``)."""
    model_dir = Path(model_dir)
    with torch.device("meta"):
        full = build(None)
        model = build(parts)
    tie = tied and getattr(model, "text", None) is not None
    head_kind = plan.linear(HEAD)
    linears = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and plan.linear(name) not in (PLAIN, FLOAT32) and not (tie and name == HEAD)
    }
    dtypes = param_dtypes(model, plan)
    reader = _Reader(slots(full), dict(model.named_parameters()), plan, names, tied, linears, dtypes)
    with host.heap_for_loading() if plan.staged else nullcontext():
        for path in weight_files(model_dir):
            reader.read(path)
        _check_complete(model_dir, reader.expected, reader.seen, names)
        state = reader.state
        if tie and head_kind not in (PLAIN, FLOAT32):  # the head's own copy, read from the file, not the map
            shape = model.get_submodule(HEAD).weight.shape
            head = _read_tensor(reader.embeddings_at, torch.empty(shape, dtype=plan.weights))
            reader.built[HEAD] = opt_in_linear(plan, HEAD, head, None, ())
            del head
            tie = False
        for name, layer in reader.built.items():
            model.set_submodule(name, layer)
        if tie:
            state[f"{HEAD}.weight"] = state[EMBEDDINGS]
        model.load_state_dict(state, strict=True, assign=True)
        state.clear()
    if tie:
        model.text.lm_head.weight = model.text.embed_tokens.weight  # assign=True made two Parameters
    if getattr(model, "text", None) is not None:
        model.text.cache_dtype = plan.kv_cache
        if plan.embeddings_in_file:
            _embeddings_left_in_file(model, reader.embeddings_at)
    return model.eval().requires_grad_(False)
