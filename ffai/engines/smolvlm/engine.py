"""The engine object behind the ``smolvlm`` entry point: its info, its cheap checks from the
checkpoint's small files, and its three stages (``ffai.engines.smolvlm.stages``, built on the kit).

Light on purpose: ``ffai engines`` imports it, so torch and the tokenizer load only inside the
calls that need them.
"""

from __future__ import annotations

from pathlib import Path

from ffai.engines.contract import DecodingOptions, EngineInfo, StageSpec
from ffai.errors import ModelError, UsageError
from ffai.kit.stages import stage_specs

INFO = EngineInfo(
    name="smolvlm",
    task="vlm",
    # stable: gated token for token against transformers (tests/test_smolvlm_*.py, oracle marker)
    status="stable",
    description=(
        "SmolVLM and SmolVLM2 (Idefics3) in plain PyTorch: SigLIP tower, pixel-shuffle connector, llama text "
        "tower; windows as video where the checkpoint knows video"
    ),
    default_model="smolvlm2-256m-video-instruct",
)

STILL_PROMPT = "Describe this image."
FRAMES_PROMPT = "Describe what happens in these frames."
VIDEO_PROMPT = "Describe what happens in this video."
WIDEST_TIME, WIDEST_DURATION = 5999.0, 35999.0
STAGES = "ffai.engines.smolvlm.stages:STAGES"  # imported where a stage is built


def prompt_text(options: DecodingOptions, images: int, *, still: bool, video: bool = False) -> str:
    """The question asked: the user's ``--prompt``, else a caption request that fits the input."""
    if options.prompt is not None:
        return options.prompt
    if video:
        return VIDEO_PROMPT
    return STILL_PROMPT if still or images == 1 else FRAMES_PROMPT


def window_presentation(options: DecodingOptions, video_capable: bool, model_dir: Path) -> str:
    """How a window's frames are shown: ``--window-as``, else as a video where the checkpoint's
    processor knows video (``video_sampling``), else as pictures. A video asked of an image-only
    checkpoint is refused."""
    if options.window_as is None:
        return "video" if video_capable else "images"
    if options.window_as == "video" and not video_capable:
        raise UsageError(
            f"--window-as video: {model_dir} is an image-only checkpoint (no video_sampling in its "
            "preprocessor_config.json); use --window-as images"
        )
    return options.window_as


class SmolVLMEngine:
    info = INFO
    model_types = ("idefics3", "smolvlm")  # config.json's: a folder of these runs here without --engine
    bench = "ffai.engines.smolvlm.bench:HOOKS"  # ffai bench vlm's hooks (transformers as the reference)

    def kernels(self, flags: frozenset[str]) -> dict:
        """What runs each dtype's linears on a CPU with ``flags``, for ``ffai engines`` (torch-free:
        the precision rules read the flags alone)."""
        from ffai.engines.smolvlm.precision import report

        return report(flags)

    def check_window(self, model_dir: Path, frames: int, options: DecodingOptions) -> None:
        from ffai.engines.smolvlm.config import ModelConfig
        from ffai.engines.smolvlm.preprocess import ProcessorConfig
        from ffai.engines.smolvlm.prompt import PromptBuilder

        config = ModelConfig.from_dir(model_dir)
        processor = ProcessorConfig.from_dir(model_dir)
        builder = PromptBuilder.from_dir(model_dir)
        _check_files_agree(model_dir, config, processor, builder)
        if options.pixel_flags:  # SmolVLM sizes pictures by edge and tile, not by a pixel budget
            raise UsageError(
                f"{options.pixel_flags[0]}: the smolvlm engine takes no pixel budget; it resizes a picture's "
                f"longest edge to {processor.longest_edge} px and cuts stills into {processor.tile_size} px tiles "
                "(frames of a window are one tile each); leave the pixel flags out"
            )
        if window_presentation(options, processor.video is not None, model_dir) == "video":
            text = prompt_text(options, frames, still=False, video=True)
            # Times are not known yet: the widest a window under ten hours writes (MM:SS up to
            # 99:59 per frame, H:MM:SS), so a window that passes here fits at any times.
            ids = builder.build_video([WIDEST_TIME] * frames, WIDEST_DURATION, text, processor.image_seq_len)
            prompt_len = len(ids)
        else:
            grids = [(0, 0)] * frames  # window frames are never split into tiles
            text = prompt_text(options, frames, still=False)
            prompt_len = builder.count_tokens(grids, text, processor.image_seq_len)
        context = config.text.max_position_embeddings
        if prompt_len + options.max_new_tokens > context:
            raise UsageError(
                f"--window {frames}: {frames} frames make a {prompt_len}-token prompt, which with "
                f"--max-new-tokens {options.max_new_tokens} exceeds the model's context of {context} tokens; "
                f"use a smaller --window"
            )

    def stages(self) -> tuple[StageSpec, ...]:
        return stage_specs(STAGES)


ENGINE = SmolVLMEngine()


def _check_files_agree(model_dir: Path, config, processor, builder) -> None:
    """The processor and tokenizer files come from the same checkpoint as config.json: the prompt
    holds as many image tokens per tile as the towers make, and they are the token the model
    replaces with image embeddings. A mixed folder would otherwise fail only after loading."""
    from ffai.engines.smolvlm.config import PROCESSORS
    from ffai.engines.smolvlm.preprocess import PROCESSOR_FILE
    from ffai.engines.smolvlm.prompt import IMAGE, TOKENIZER_CONFIG_FILE
    from ffai.kit.config_json import CONFIG_FILE, read_json_object
    from ffai.kit.tokenizing import TOKENIZER_FILE

    # Each generation's files name its processor; SmolVLM2's tokenizer config (its special tokens,
    # its vocabulary size) must not sit beside a SmolVLM config or the other way round.
    expected = PROCESSORS[config.model_type]
    named = dict(processor.processor_classes)
    tokenizer_config = model_dir / TOKENIZER_CONFIG_FILE
    if tokenizer_config.is_file() or config.model_type != "idefics3":
        cls = read_json_object(tokenizer_config, "tokenizer config").get("processor_class")
        if isinstance(cls, str):
            named[TOKENIZER_CONFIG_FILE] = cls
    for name, cls in named.items():
        if cls != expected:
            raise ModelError(
                f"{model_dir / name}: processor_class {cls!r}, but {model_dir / CONFIG_FILE} is model_type "
                f"{config.model_type!r}, whose processor is {expected}; the two files come from different checkpoints"
            )

    if processor.image_seq_len != config.image_seq_len:
        raise ModelError(
            f"{model_dir / PROCESSOR_FILE}: image_seq_len {processor.image_seq_len} does not match "
            f"{model_dir / CONFIG_FILE}, whose tiles make {config.image_seq_len} image tokens each; "
            "the two files come from different checkpoints"
        )
    if builder.image_token_id != config.image_token_id:
        raise ModelError(
            f"{model_dir / TOKENIZER_FILE}: {IMAGE} is token {builder.image_token_id}, but "
            f"{model_dir / CONFIG_FILE} has image_token_id {config.image_token_id}; "
            "the two files come from different checkpoints"
        )
