"""What every engine's transformers reference arm does the same way (``ffai.bench.hooks.ReferenceArm``):
answer greedily with ``generate`` and leave out the stop token that ended the answer, as ffai does.
An engine's arm loads its own model and processor (``loaded``) and says how a request becomes the
processor's inputs (``inputs``); nothing here imports transformers."""

from __future__ import annotations

import abc
from pathlib import Path

from ffai.bench import cases
from ffai.engines.contract import DecodingOptions, Request


class TransformersArm(abc.ABC):
    name = "reference"

    def __init__(self, model_dir: Path, cores: int) -> None:
        self.model_dir = Path(model_dir)  # the reference is the float32 baseline whatever --dtype says
        self.cores = cores
        self.model = self.processor = None
        self.stop_ids: set[int] = set()

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

    def close(self) -> None:
        self.model = self.processor = None
