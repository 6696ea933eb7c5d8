"""The engine object behind the ``smolvlm`` entry point: its info, its cheap checks from the
checkpoint's small files, and where its three stages are built (``ffai_smolvlm.stages``).

Light on purpose: ``ffai engines`` imports it, so torch and the tokenizer load only inside the
calls that need them.
"""

from __future__ import annotations

from pathlib import Path

from ffai.engine import DecodingOptions, EngineInfo, StageSpec
from ffai.errors import ModelError, UsageError

INFO = EngineInfo(
    name="smolvlm",
    task="vlm",
    # stable: gated token for token against transformers (tests/test_smolvlm_*.py, oracle marker)
    status="stable",
    description="SmolVLM / Idefics3 in plain PyTorch: SigLIP tower, pixel-shuffle connector, llama text tower",
    default_model="smolvlm2-256m-video-instruct",
)

STILL_PROMPT = "Describe this image."
FRAMES_PROMPT = "Describe what happens in these frames."
STAGES = "ffai_smolvlm.stages"  # the heavy module, imported where a stage is built


def prompt_text(options: DecodingOptions, images: int, *, still: bool) -> str:
    """The question asked: the user's ``--prompt``, else a caption request that fits the input."""
    if options.prompt is not None:
        return options.prompt
    return STILL_PROMPT if still or images == 1 else FRAMES_PROMPT


class SmolVLMEngine:
    info = INFO
    bench = "ffai_smolvlm.bench:HOOKS"  # ffai bench vlm's hooks (transformers as the reference)

    def check_window(self, model_dir: Path, frames: int, options: DecodingOptions) -> None:
        from ffai_smolvlm.config import ModelConfig
        from ffai_smolvlm.preprocess import ProcessorConfig
        from ffai_smolvlm.prompt import PromptBuilder

        config = ModelConfig.from_dir(model_dir)
        processor = ProcessorConfig.from_dir(model_dir)
        builder = PromptBuilder.from_dir(model_dir)
        _check_files_agree(model_dir, config, processor, builder)
        grids = [(0, 0)] * frames  # window frames are never split into tiles
        prompt_len = builder.count_tokens(grids, prompt_text(options, frames, still=False), processor.image_seq_len)
        context = config.text.max_position_embeddings
        if prompt_len + options.max_new_tokens > context:
            raise UsageError(
                f"--window {frames}: {frames} frames make a {prompt_len}-token prompt, which with "
                f"--max-new-tokens {options.max_new_tokens} exceeds the model's context of {context} tokens; "
                f"use a smaller --window"
            )

    def stages(self) -> tuple[StageSpec, ...]:
        # Preprocessing shares the vision worker: it is light, and its tiles then stay local.
        return (
            StageSpec("preprocess", f"{STAGES}:preprocess_stage", process="vision"),
            StageSpec("vision", f"{STAGES}:vision_stage", process="vision"),
            StageSpec("text", f"{STAGES}:text_stage", process="text"),
        )


ENGINE = SmolVLMEngine()


def _check_files_agree(model_dir: Path, config, processor, builder) -> None:
    """The processor and tokenizer files come from the same checkpoint as config.json: the prompt
    holds as many image tokens per tile as the towers make, and they are the token the model
    replaces with image embeddings. A mixed folder would otherwise fail only after loading."""
    from ffai_smolvlm.config import CONFIG_FILE
    from ffai_smolvlm.preprocess import PROCESSOR_FILE
    from ffai_smolvlm.prompt import IMAGE, TOKENIZER_FILE

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
