"""The engine object behind the ``qwen3-vl`` entry point: its info, its cheap checks from the
checkpoint's files, the pixel budgets it takes from the core's options, and its three stages
(``ffai.engines.qwen3vl.stages``, built on the kit).

Light on purpose: ``ffai engines`` imports it, so torch and the tokenizer load only inside the
calls that need them.
"""

from __future__ import annotations

from pathlib import Path

from ffai.engines.contract import DecodingOptions, EngineInfo, StageSpec
from ffai.errors import ModelError, UsageError
from ffai.kit.stages import stage_specs

# experimental until its oracle gates (tests/test_qwen3vl_*.py) hold at the real shapes in CI
DESCRIPTION = (
    "Qwen3-VL (2B, 4B Instruct) in plain PyTorch: ViT with DeepStack, Qwen3 text tower with "
    "interleaved multimodal RoPE; stills resized to a pixel budget, windows as video with their times"
)
INFO = EngineInfo("qwen3-vl", "vlm", "experimental", DESCRIPTION, default_model="qwen3-vl-2b-instruct")

STILL_PROMPT = "Describe this image."
VIDEO_PROMPT = "Describe what happens in this video."
# Times are not known before decoding: the widest a window's frame times from its start write
# (one decimal), for a window under ten hours, so a window that passes here fits at any times.
WIDEST_TIME = 35999.9
STAGES = "ffai.engines.qwen3vl.stages:STAGES"  # imported where a stage is built


def prompt_text(options: DecodingOptions, *, still: bool) -> str:
    """The question asked: the user's ``--prompt``, else a caption request that fits the input."""
    if options.prompt is not None:
        return options.prompt
    return STILL_PROMPT if still else VIDEO_PROMPT


def check_presentation(options: DecodingOptions) -> None:
    """A window reaches Qwen3-VL as one clip with its frame times (the video processor's way)."""
    if options.window_as == "images":
        raise UsageError(
            "--window-as images: the qwen3-vl engine shows a window as one video with its frame times; "
            "leave --window-as out (or give video)"
        )


def clip_frame_count(frames: int) -> int:
    """Frames of the clip a window of ``frames`` frames becomes (a lone frame is doubled:
    ``video_frames.clip_frames``)."""
    return max(frames, 2)


def frame_budget_factor(frames: int, temporal_patch_size: int) -> int:
    """What a per-frame budget is multiplied by to become the clip's.

    transformers' ``Qwen3VLVideoProcessor`` tests the clip's area with the frame count rounded
    (half to even) to whole pairs but rescales by the count itself, so for an odd count the two
    differ (``video_frames.video_smart_resize``). The smaller of the two keeps every frame within
    the per-frame maximum; a frame may then stay up to a quarter under the minimum (3 frames) or
    be scaled to 0.8 of it (5 frames): the processor's own rounding, kept so the pixels stay its."""
    n = clip_frame_count(frames)
    return min(n, round(n / temporal_patch_size) * temporal_patch_size)


def processor_config(model_dir: Path, options: DecodingOptions, frames: int | None = None):
    """The checkpoint's processor settings (``preprocess.ProcessorConfig``) with the pixel flags
    of ``options`` in place: ``--min/max-pixels`` as the image budget, and for a window of
    ``frames`` frames ``--frame-min/max-pixels`` times ``frame_budget_factor`` as the clip's.
    A budget whose minimum exceeds its maximum is one line naming the flags."""
    from ffai.engines.qwen3vl.preprocess import PREPROCESSOR_FILE, VIDEO_PREPROCESSOR_FILE, ProcessorConfig

    cfg = ProcessorConfig.from_dir(model_dir)
    image_min = options.min_pixels if options.min_pixels is not None else cfg.image.min_pixels
    image_max = options.max_pixels if options.max_pixels is not None else cfg.image.max_pixels
    if image_min > image_max:
        raise UsageError(
            f"--min-pixels/--max-pixels: a still's budget would be {image_min} to {image_max} pixels "
            f"(unset ones from {model_dir / PREPROCESSOR_FILE}); give a minimum at most the maximum"
        )
    video_min, video_max = cfg.video.min_pixels, cfg.video.max_pixels
    if frames is not None:
        scale = frame_budget_factor(frames, cfg.temporal_patch_size)
        video_min = options.frame_min_pixels * scale if options.frame_min_pixels is not None else video_min
        video_max = options.frame_max_pixels * scale if options.frame_max_pixels is not None else video_max
        if video_min > video_max:
            raise UsageError(
                f"--frame-min-pixels/--frame-max-pixels: a window of {frames} frames would get {video_min} to "
                f"{video_max} pixels in all (unset ones from {model_dir / VIDEO_PREPROCESSOR_FILE}, a clip's "
                "budget); give a minimum at most the maximum"
            )
    return cfg.with_pixels(image_min=image_min, image_max=image_max, video_min=video_min, video_max=video_max)


class Qwen3VLEngine:
    info = INFO
    model_types = ("qwen3_vl",)  # config.json's: a folder of this family runs here without --engine
    bench = "ffai.engines.qwen3vl.bench:HOOKS"  # ffai bench vlm's hooks (transformers as the reference)

    def kernels(self, flags: frozenset[str]) -> dict:
        """What runs each dtype's linears (and the vision attention) on a CPU with ``flags``, for
        ``ffai engines`` (torch-free: the precision rules read the flags alone)."""
        from ffai.engines.qwen3vl.precision import report

        return report(flags)

    def check_window(self, model_dir: Path, frames: int, options: DecodingOptions) -> None:
        """Refuse, before any weight loads, a folder whose files disagree or a window whose
        largest prompt cannot fit the context (every frame as large as its budget allows)."""
        from ffai.engines.qwen3vl.config import ModelConfig
        from ffai.engines.qwen3vl.prompt import PromptBuilder

        check_presentation(options)
        config = ModelConfig.from_dir(model_dir)
        cfg = processor_config(model_dir, options, frames)
        builder = PromptBuilder.from_dir(model_dir)
        check_files_agree(model_dir, config, builder)
        n = clip_frame_count(frames)
        # A bound at any frame size and aspect: the largest frame is not the longest prompt (a thin
        # frame under a small --frame-max-pixels makes more tokens than a square one).
        text = prompt_text(options, still=False)
        prompt_len = builder.count_widest(n, text, WIDEST_TIME, cfg)
        context = config.text.max_position_embeddings
        if prompt_len + options.max_new_tokens > context:
            raise UsageError(
                f"--window {frames}: {frames} frames make a prompt of up to {prompt_len} tokens, which with "
                f"--max-new-tokens {options.max_new_tokens} exceeds the model's context of {context} tokens; "
                "use a smaller --window or --frame-max-pixels"
            )

    def stages(self) -> tuple[StageSpec, ...]:
        return stage_specs(STAGES)


ENGINE = Qwen3VLEngine()


def check_files_agree(model_dir: Path, config, builder) -> None:
    """The tokenizer, the processor configs and the weights belong with config.json: the vision
    tokens are the ids the model replaces, and every tensor the index names is there with the
    config's shape (headers only: nothing is loaded). A mixed or incomplete folder would
    otherwise fail only after loading."""
    from ffai.engines.qwen3vl.prompt import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START
    from ffai.engines.qwen3vl.weights import check_checkpoint
    from ffai.kit.config_json import CONFIG_FILE
    from ffai.kit.tokenizing import TOKENIZER_FILE

    for token, ours, theirs in (
        (IMAGE_PAD, builder.image_token_id, config.image_token_id),
        (VIDEO_PAD, builder.video_token_id, config.video_token_id),
        (VISION_START, builder.vision_start_id, config.vision_start_token_id),
        (VISION_END, builder.vision_end_id, config.vision_end_token_id),
    ):
        if ours != theirs:
            raise ModelError(
                f"{model_dir / TOKENIZER_FILE}: {token} is token {ours}, but {model_dir / CONFIG_FILE} says "
                f"{theirs}; the two files come from different checkpoints"
            )
    check_checkpoint(model_dir, config)
