"""What every engine's transformers reference arm does the same way (``ffai.bench.hooks.ReferenceArm``):
load the checkpoint with transformers (float32, the engine's writer naming the classes), answer
greedily with ``generate`` and leave out the stop token that ended the answer, as ffai does. An
engine's arm says only how a request becomes the processor's inputs (``inputs``), shown as ffai
shows it; nothing here imports transformers at import time."""

from __future__ import annotations

import abc
import importlib.util
from pathlib import Path

from ffai.bench import cases
from ffai.bench.writer import CONFIG_FILE, CheckpointWriter, read_json
from ffai.engines.contract import DecodingOptions, Request
from ffai.errors import ModelError


def missing_reference(packages: tuple[str, ...]) -> str:
    return f"the reference arm needs {' and '.join(packages)}: pip install 'ffai[reference]'"


def require(packages: tuple[str, ...]) -> None:
    """Fail early, in one line, when a package the reference needs is not installed (the
    [reference] extra)."""
    try:
        found = all(importlib.util.find_spec(name) is not None for name in packages)
    except (ImportError, ValueError):  # a broken install, or sys.modules[name] = None
        found = False
    if not found:
        raise ModelError(missing_reference(packages))


def merge_inputs(parts: list, pad_id: int) -> dict:
    """One batch from several prompts' processor outputs: what runs along the tokens
    (``input_ids``, ``attention_mask``, token types) left-padded to the longest, with ``pad_id``
    for ids and 0 elsewhere; the pictures' tensors stacked along dim 0, zero-padded where a
    window has fewer pictures (Idefics3 drops all-zero pictures, as its processor pads them)."""
    import torch
    import torch.nn.functional as F

    lengths = [part["input_ids"].shape[1] for part in parts]
    longest = max(lengths)
    merged = {}
    for key in parts[0].keys():
        tensors = [part[key] for part in parts]
        if all(t.dim() >= 2 and t.shape[:2] == (1, n) for t, n in zip(tensors, lengths)):
            fill = pad_id if key == "input_ids" else 0
            merged[key] = torch.cat([F.pad(t, (longest - t.shape[1], 0), value=fill) for t in tensors])
            continue
        shape = [max(t.shape[d] for t in tensors) for d in range(1, tensors[0].dim())]
        padded = []
        for t in tensors:
            room = t.new_zeros((t.shape[0], *shape))  # new_zeros: bool masks pad as well as floats
            room[tuple(slice(0, n) for n in t.shape)] = t
            padded.append(room)
        merged[key] = torch.cat(padded)
    return merged


class TransformersArm(abc.ABC):
    name = "reference"
    writer: CheckpointWriter  # the engine's: it names transformers' classes for a checkpoint
    packages: tuple[str, ...] = ("transformers",)  # what the reference needs installed

    def __init__(self, model_dir: Path, cores: int) -> None:
        self.model_dir = Path(model_dir)  # the reference is the float32 baseline whatever --dtype says
        self.cores = cores
        self.model = self.processor = None
        self.stop_ids: set[int] = set()

    def load(self) -> None:
        try:
            import torch
            from transformers import AutoProcessor
        except ImportError as e:
            raise ModelError(missing_reference(self.packages)) from e
        # The same cores ffai plans its placement and threads for, all given to the one process.
        torch.set_num_threads(self.cores)
        model_class = self.writer.model_class(read_json(self.model_dir / CONFIG_FILE))
        model = model_class.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self.loaded(
            model, AutoProcessor.from_pretrained(self.model_dir, **self.writer.processor_options(self.model_dir))
        )

    def loaded(self, model, processor) -> None:
        """Keep the loaded model and processor; the answer stops on its generation config's eos ids."""
        self.model, self.processor = model, processor
        eos = model.generation_config.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos])

    @abc.abstractmethod
    def inputs(self, request: Request, options: DecodingOptions):
        """The processor's inputs for ``request``, shown as ffai shows it."""

    def answer(self, item, options: DecodingOptions) -> tuple[list[int], str]:
        import torch

        inputs = self.inputs(item.request(options), options)
        # Greedy whatever generation_config.json asks (Qwen3-VL's asks for sampling): ffai's rule.
        budget = {"max_new_tokens": options.max_new_tokens, "do_sample": False}
        if options.force_new_tokens:
            budget["min_new_tokens"] = options.max_new_tokens
        with torch.inference_mode():
            out = self.model.generate(**inputs, **budget)
        tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
        # transformers keeps the stop token that ended the answer; ffai leaves it out.
        if tokens and tokens[-1] in self.stop_ids and not options.force_new_tokens:
            tokens = tokens[:-1]
        return tokens, self.processor.decode(tokens, skip_special_tokens=True)

    def answer_all(self, items: list, options: list[DecodingOptions]) -> dict[str, tuple[list[int], str]]:
        return {it.id: self.answer(it, o) for it, o in zip(items, options)}

    def clip(self, path: Path) -> dict[str, list[int]]:
        options = cases.decoding()
        return {item.id: self.answer(item, options)[0] for item in cases.clip_items(path)}

    def clip_batched(self, path: Path, batch: int) -> dict[str, list[int]]:
        """The clip's windows ``batch`` at a time through one ``generate`` each, left-padded as
        transformers batches prompts: the strongest way its own API decodes several windows."""
        import torch

        options = cases.decoding()
        windows = list(cases.clip_items(path))
        pad = self.processor.tokenizer.pad_token_id
        pad = pad if pad is not None else min(self.stop_ids)
        budget = {"max_new_tokens": options.max_new_tokens, "min_new_tokens": options.max_new_tokens}
        found = {}
        for first in range(0, len(windows), batch):
            group = windows[first : first + batch]
            inputs = merge_inputs([self.inputs(item.request(options), options) for item in group], pad)
            with torch.inference_mode():
                out = self.model.generate(**inputs, **budget, do_sample=False, pad_token_id=pad)
            for row, item in enumerate(group):
                found[item.id] = out[row, inputs["input_ids"].shape[1] :].tolist()
        return found

    def info(self) -> dict:
        """What the report keeps about this arm: its threads and its processors' classes."""
        import torch

        found = {"torch_threads": {"main": torch.get_num_threads()}}
        for part in ("image_processor", "video_processor"):
            if getattr(self.processor, part, None) is not None:
                found[part] = type(getattr(self.processor, part)).__name__
        return found

    def close(self) -> None:
        self.model = self.processor = None
