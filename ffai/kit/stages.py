"""An engine's pipeline as the kit builds it: preprocess → vision → text, each stage made by a factory
the pipeline calls in the process that runs it (``ffai.engines.contract.StageSpec``).

An engine subclasses :class:`EngineStages` with its architecture (its config, its model, its
weight names, its precision choices, its preprocessing and vision stages, its prompts) and gives
``stage_specs("module:OBJECT")``'s specs as its ``stages()``; the factories, the loading and the
text stage (:class:`TextDecoder`: the token loop over the kit's text tower) are the same for every
engine. Nothing here knows about processes, threads or the CLI.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ffai.engines.contract import Answer, DecodingOptions, RuntimeOptions, StageSpec
from ffai.kit.stop_strings import StopFilter, cut, ended_by
from ffai.kit.tokenizing import ChatPrompts, generate_streamed

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from ffai.kit.config_json import CheckpointConfig
    from ffai.kit.precision import PrecisionPlan
    from ffai.kit.weight_names import WeightNames


# An engine's model parts (``ffai.kit.model_parts``): the first makes pictures into features, the
# second is the text tower.
VISION, TEXT = PARTS = ("vision", "text")


@dataclass
class Encoded:
    """Output of an engine's vision stage: the prompt ids, what its vision part made of the
    pictures (the engine's own type), and the options of the request."""

    input_ids: list[int]
    visual: Any
    options: DecodingOptions


def stage_specs(stages: str) -> tuple[StageSpec, ...]:
    """The three stages of the engine whose :class:`EngineStages` object is ``stages``
    (``"module:OBJECT"``, imported only where a stage is built). Preprocessing shares the vision
    worker: it is light, and its pictures then stay local."""
    return (
        StageSpec("preprocess", f"{stages}.preprocess_stage", process="vision"),
        StageSpec("vision", f"{stages}.vision_stage", process="vision"),
        StageSpec("text", f"{stages}.text_stage", process="text"),
    )


@dataclass(frozen=True)
class EngineStages:
    """An engine's architecture, as the kit builds and loads its stages from it:

    - ``weight_names``: the checkpoint's names of its tensors (``ffai.kit.weight_names``);
    - ``config``: its config class (a ``ffai.kit.config_json.CheckpointConfig``), whose configs
      have ``.text`` (a ``ffai.kit.text_config.TextConfig``) and ``.tie_word_embeddings``;
    - ``prompts``: its prompt builder class (a ``ffai.kit.tokenizing.ChatPrompts``);
    - ``precision(dtype, device)``: what a dtype means for it here (a ``PrecisionPlan``);
    - ``preprocessor(model_dir)``: stage 1, a ``Request`` -> what stage 2 takes (no weights);
    - ``vision_encoder(net, model_dir)``: stage 2, that -> an :class:`Encoded`;
    - ``build(cfg, parts, plan)``: its model holding ``parts`` (None: all of ``PARTS``) as ``plan``
      shapes it, with a ``.text`` tower (``ffai.kit.text_tower.TextModel``) where the text part
      is held and ``prompt(encoded)`` making its ``ffai.kit.generate.Prompt``.
    """

    weight_names: WeightNames
    config: type[CheckpointConfig]
    prompts: type[ChatPrompts]
    precision: Callable[..., PrecisionPlan]
    preprocessor: Callable[[Path], Callable]
    vision_encoder: Callable[[nn.Module, Path], Callable]
    build: Callable[[Any, tuple[str, ...] | None, PrecisionPlan], nn.Module]

    def load_model(
        self, model_dir: Path | str, plan: PrecisionPlan | None = None, parts: tuple[str, ...] | None = None
    ) -> nn.Module:
        """The model's ``parts`` (None: all) from ``model_dir``, as ``plan`` says (default: float32
        on the CPU, the exact path)."""
        from ffai.kit.loading import load_model

        model_dir = Path(model_dir)
        plan = self.precision("float32") if plan is None else plan
        cfg = self.config.from_dir(model_dir)
        build = functools.partial(self.build, cfg, plan=plan)
        return load_model(model_dir, build, self.weight_names, plan, tied=cfg.tie_word_embeddings, parts=parts)

    def load(self, model_dir: Path | str, runtime: RuntimeOptions, parts: tuple[str, ...] | None = None) -> nn.Module:
        """The model's ``parts`` in ``runtime``'s precision on its device; with ``runtime.compile``
        the text tower's compiled decode step attached."""
        from ffai.kit import compiled_decode
        from ffai.kit.loading import weight_files

        plan = self.precision(runtime.dtype, runtime.device)
        model = self.load_model(model_dir, plan, parts)
        if getattr(model, "text", None) is not None and runtime.compile:
            compiled_decode.attach(model.text, weight_files(Path(model_dir)), plan.dtype)
        return model

    # Stage factories, called in worker processes as factory(model_dir, runtime).

    def preprocess_stage(self, model_dir: str, runtime: RuntimeOptions) -> Callable:
        return self.preprocessor(Path(model_dir))

    def vision_stage(self, model_dir: str, runtime: RuntimeOptions) -> Callable:
        return self.vision_encoder(self.load(model_dir, runtime, parts=(VISION,)), Path(model_dir))

    def text_stage(self, model_dir: str, runtime: RuntimeOptions) -> TextDecoder:
        net, prompts = self.load(model_dir, runtime, parts=(TEXT,)), self.prompts.from_dir(Path(model_dir))
        return TextDecoder(net, prompts) if runtime.batch == 1 else BatchedTextDecoder(net, prompts, runtime.batch)


class TextDecoder:
    """The text stage: an :class:`Encoded` in, the answer out (the kit's text tower, its static KV
    cache and token loop). ``net`` is the engine's model holding its text part: it makes the
    prompt (``net.prompt(encoded)``), the kit generates from it."""

    def __init__(self, net: nn.Module, prompts: ChatPrompts) -> None:
        self.net = net
        self.prompts = prompts
        self.stop_ids = prompts.stop_ids()

    def __call__(self, encoded: Encoded, on_text: Callable[[str], None] | None = None) -> Answer:
        """The answer; with ``on_text``, also its text piece by piece as it is generated (the
        pieces add up to ``Answer.text``: with stop strings, the text before the first)."""
        if on_text is None:
            ids = self.generate_ids(encoded)
        else:
            shown = StopFilter(encoded.options.stop, on_text)
            ids = generate_streamed(functools.partial(self.generate_ids, encoded), self.prompts.text_stream(), shown)
            shown.finish()
        return self.answer(ids, encoded.options.stop)

    def generate_ids(self, encoded: Encoded, on_token: Callable[[int], None] | None = None) -> list[int]:
        import torch

        from ffai.kit.generate import generate

        ended = ended_by(encoded.options.stop, self.prompts.decode)
        with torch.inference_mode():
            return generate(self.net.text, self.net.prompt(encoded), encoded.options, self.stop_ids, on_token, ended)

    def answer(self, ids: list[int], stops: tuple[str, ...]) -> Answer:
        """The answer of ``ids``: their text, up to the first stop string."""
        return Answer(cut(self.prompts.decode(ids), stops), tuple(ids))


class BatchedTextDecoder(TextDecoder):
    """The text stage serving up to ``max_active`` windows at once (``RuntimeOptions.batch``): a
    continuous stage (``ffai.pipeline.scheduler.ContinuousScheduler``), which a window joins between
    two decode steps and leaves with its answer the moment it ends. Called as a function, it
    answers one window alone, as :class:`TextDecoder` does: the same tokens either way
    (``ffai.kit.batched_decode``)."""

    def __init__(self, net: nn.Module, prompts: ChatPrompts, max_active: int) -> None:
        from ffai.kit.batched_decode import DecodeBatch

        super().__init__(net, prompts)
        self.max_active = max_active
        self._batch = DecodeBatch(net.text, self.stop_ids)
        self._streams: dict[Any, tuple[Any, StopFilter]] = {}
        self._stops: dict[Any, tuple[str, ...]] = {}

    def active(self) -> int:
        return len(self._batch)

    def join(self, key: Any, encoded: Encoded, on_text: Callable[[str], None] | None = None) -> Answer | None:
        """Start window ``key``: its answer if it ends at its first token, else None (see ``step``).
        ``on_text`` as for ``__call__``."""
        import torch

        on_token = None
        stops = encoded.options.stop
        if on_text is not None:
            stream, shown = self.prompts.text_stream(), StopFilter(stops, on_text)
            self._streams[key] = (stream, shown)

            def on_token(token_id: int) -> None:
                if piece := stream.step(token_id):
                    shown(piece)

        self._stops[key] = stops
        ended = ended_by(stops, self.prompts.decode)
        try:
            with torch.inference_mode():
                ids = self._batch.join(key, self.net.prompt(encoded), encoded.options, on_token, ended)
        except BaseException:
            self._streams.pop(key, None)
            self._stops.pop(key, None)
            raise
        return None if ids is None else self._answer(key, ids)

    def step(self) -> list[tuple[Any, Answer]]:
        """One token for every window being decoded; the answers of those that ended."""
        import torch

        with torch.inference_mode():
            ended = self._batch.step()
        return [(key, self._answer(key, ids)) for key, ids in ended]

    def drop(self, key: Any) -> None:
        self._batch.drop(key)
        self._streams.pop(key, None)
        self._stops.pop(key, None)

    def _answer(self, key: Any, ids: list[int]) -> Answer:
        stream = self._streams.pop(key, None)
        if stream is not None:
            if rest := stream[0].finish():
                stream[1](rest)
            stream[1].finish()
        return self.answer(ids, self._stops.pop(key, ()))
