"""Load a Qwen3-VL checkpoint (one safetensors file, or shards with their index) into :class:`Qwen3VL`.

Safetensors only (never pickle). Everything is checked before a weight is read: the files the
index names exist and hold the tensors it says; every tensor maps to a parameter of the model the
config describes, with the config's shape; every parameter is filled (a tied LM head by the
embedding table). Any failure is one :class:`ModelError` line naming the file (and the tensor).
The module is built on the meta device and each parameter is assigned its tensor, read in the
dtype asked for, so no random init runs.

Checkpoint names map to module names by one table of prefixes, ``WEIGHT_PREFIXES``: the modules
mirror transformers' own names below ``model.visual`` and ``model.language_model``, which are
the hub checkpoints' names (the 4B's index lists them) and what transformers 5.24's
``Qwen3VLForConditionalGeneration.save_pretrained`` writes.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from ffai.errors import ModelError
from ffai.kit import host
from ffai.kit.tensor_files import RawHeader

from .config import ModelConfig
from .model import PARTS, Qwen3VL

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TIED_HEAD = "lm_head.weight"

# checkpoint name prefix -> module name prefix
WEIGHT_PREFIXES = {
    "model.visual.": "visual.",
    "model.language_model.": "text.",
    "lm_head.": "text.lm_head.",
}


def module_name(name: str) -> str | None:
    """The module parameter a checkpoint tensor fills, or None for a name outside the table."""
    for prefix, target in WEIGHT_PREFIXES.items():
        if name.startswith(prefix):
            return target + name[len(prefix) :]
    return None


def part_of(param: str) -> str:
    return "vision" if param.startswith("visual.") else "text"


def weight_files(model_dir: Path) -> dict[str, Path]:
    """Each tensor's file: from the index where there is one (every shard it names must exist
    and be listed), else every tensor of the single file."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelError(f"{index}: cannot read the shard index: {e}") from e
        files = {}
        for shard in sorted(set(weight_map.values())):
            path = model_dir / shard
            if Path(shard).name != shard or not path.is_file():
                raise ModelError(f"{path}: shard missing (named by {INDEX_FILE})")
            files[shard] = path
        at: dict[str, Path] = {}
        for shard, path in files.items():
            names = set(_keys(path))
            listed = {n for n, s in weight_map.items() if s == shard}
            if listed - names:
                raise ModelError(f"{path}: lacks tensor {sorted(listed - names)[0]} that {INDEX_FILE} places there")
            if names - listed:
                raise ModelError(f"{path}: holds tensor {sorted(names - listed)[0]} that {INDEX_FILE} does not list")
            at.update(dict.fromkeys(listed, path))
        return at
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise ModelError(f"{model_dir}: no {SINGLE_FILE} and no {INDEX_FILE} in the model folder")
    return dict.fromkeys(_keys(single), single)


def _keys(path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return list(f.keys())
    except Exception as e:  # safetensors raises its own error types for a damaged header
        raise ModelError(f"{path}: not a readable safetensors file: {e}") from e


def _shapes(path: Path, names: list[str]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        return {n: tuple(f.get_slice(n).get_shape()) for n in names}


def plan_tensors(model_dir: Path, cfg: ModelConfig) -> dict[str, tuple[str, Path]]:
    """module parameter -> (checkpoint name, file) for the whole model, after every check."""
    with torch.device("meta"):
        full = Qwen3VL(cfg)
    expected = {n: tuple(p.shape) for n, p in full.named_parameters(remove_duplicate=False)}
    at = weight_files(model_dir)
    by_file: dict[Path, list[str]] = {}
    for name, path in at.items():
        by_file.setdefault(path, []).append(name)
    plan: dict[str, tuple[str, Path]] = {}
    for path, names in by_file.items():
        for name, shape in _shapes(path, names).items():
            param = module_name(name)
            if param is None or param not in expected:
                raise ModelError(f"{path}: tensor {name} is not part of a Qwen3-VL model with this config.json")
            if shape != expected[param]:
                raise ModelError(
                    f"{path}: tensor {name} has shape {list(shape)}, config.json says {list(expected[param])}"
                )
            if name == TIED_HEAD and cfg.tie_word_embeddings:
                continue  # the config ties the head to the embedding table, as transformers does
            plan[param] = (name, path)
    tied = {"text.lm_head.weight"} if cfg.tie_word_embeddings else set()
    missing = [p for p in expected if p not in plan and p not in tied]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelError(f"{model_dir}: checkpoint is missing tensor(s) for {shown}")
    return plan


def low_precision(model: Qwen3VL) -> frozenset[str]:
    """The parameters a ``--dtype`` other than float32 may hold in a lower dtype: the linears' and
    the patch embedding's, and the token embedding table. Norms and the position table stay
    float32, and so the residual streams (``layers.Linear``); ``precision.PrecisionPlan`` says
    what each of these becomes."""
    kept = set()
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv3d)) or name == "text.embed_tokens":
            kept |= {f"{name}.{p}" for p, _ in module.named_parameters(recurse=False)}
    return frozenset(kept)


def load_model(
    model_dir: Path | str, dtype: str = "float32", *, parts: tuple[str, ...] = PARTS, precision=None
) -> Qwen3VL:
    """:class:`Qwen3VL` from a checkpoint folder, holding ``parts`` ("vision", "text") in ``dtype``
    as ``precision`` says (a ``precision.PrecisionPlan``; default: ``plan_precision`` for this
    machine's CPU): float32 is the exact path. Linears the plan makes int8 or packed bfloat16 are built from each tensor as it is
    read, so no float32 copy of them stays resident.

    The whole checkpoint is checked either way, so a folder loads for one part exactly when it loads
    for both."""
    from ffai.engines.contract import DTYPES

    if dtype not in DTYPES:
        raise ModelError(f"dtype {dtype!r} is not supported by the Qwen3-VL engine (one of {', '.join(DTYPES)})")
    from safetensors import safe_open

    from .precision import FLOAT32, PLAIN, build_linear, plan_precision

    precision = plan_precision(dtype) if precision is None else precision
    dtype_name = dtype
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    plan = plan_tensors(model_dir, cfg)
    with torch.device("meta"):
        model = Qwen3VL(cfg, parts)
    low = low_precision(model)
    kinds = {n: precision.linear(n) for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    built = {n for n, kind in kinds.items() if kind not in (PLAIN, FLOAT32)}

    def dtype_of(param: str) -> torch.dtype:
        module = param.rpartition(".")[0]
        if param not in low or kinds.get(module) == FLOAT32:
            return torch.float32
        return precision.embeddings if module == "text.embed_tokens" else precision.weights

    wanted = {p: plan[p] for p, _ in model.named_parameters() if p in plan}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for param, (name, path) in wanted.items():
        by_file.setdefault(path, []).append((param, name))
    tie = cfg.tie_word_embeddings and "text" in model.parts
    head, table = "text.lm_head", "text.embed_tokens.weight"
    state, pending = {}, {}
    shapes = {p: t.shape for p, t in model.named_parameters()}

    def read(f, header: RawHeader, param: str, name: str, dtype: torch.dtype) -> torch.Tensor:
        # float32 maps the file, as transformers does; a load that converts reads each tensor
        # instead, since a touched map stays resident: a 2B int8 load held the whole 8.5 GB
        # file beside its 3.4 GB of weights.
        if dtype_name == "float32":
            return f.get_tensor(name).to(dtype)
        return header.read_into(name, torch.empty(shapes[param], dtype=dtype), f)

    # A load that reads through buffers runs under glibc's heap settings for it (ffai.kit.host): else
    # the freed float32 reads stay in the heap (docs/benchmarks.md, Qwen3-VL's memory).
    with host.heap_for_loading() if dtype_name != "float32" else nullcontext():
        for path, items in by_file.items():
            with safe_open(str(path), framework="pt", device="cpu") as f, open(path, "rb") as raw:
                header = RawHeader(raw)
                for param, name in items:
                    module, _, leaf = param.rpartition(".")
                    if module not in built:
                        if param == table and tie and head in built:  # the head's own copy, from the file's values
                            tensor = read(f, header, param, name, torch.float32)
                            model.set_submodule(head, build_linear(kinds[head], tensor, None, precision))
                            state[param] = tensor.to(dtype_of(param))
                            del tensor
                        else:
                            state[param] = read(f, header, param, name, dtype_of(param))
                        continue
                    pending.setdefault(module, {})[leaf] = read(f, header, param, name, torch.float32)
                    if _complete(model, module, pending[module]):  # build as soon as its tensors are read
                        tensors = pending.pop(module)
                        model.set_submodule(
                            module, build_linear(kinds[module], tensors["weight"], tensors.get("bias"), precision)
                        )
    if tie and head in built:
        tie = False
    elif tie and state[table].dtype != dtype_of(f"{head}.weight"):
        state[f"{head}.weight"] = state[table].to(dtype_of(f"{head}.weight"))
        tie = False
    elif tie:
        state[f"{head}.weight"] = state[table]
    model.load_state_dict(state, strict=True, assign=True)
    state.clear()
    if model.visual is not None:
        for block in model.visual.blocks:
            block.attn.attention_dtype = precision.vision_attention
    if model.text is not None:
        model.text.cache_dtype = precision.kv_cache
    if tie:
        model.text.lm_head.weight = model.text.embed_tokens.weight  # assign=True made two Parameters
    return model.eval().requires_grad_(False)


def _complete(model: Qwen3VL, module: str, tensors: dict) -> bool:
    """Whether ``tensors`` hold every parameter of the (meta) linear ``module``."""
    return "weight" in tensors and (model.get_submodule(module).bias is None or "bias" in tensors)
