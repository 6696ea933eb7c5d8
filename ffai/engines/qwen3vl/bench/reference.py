"""The bench's reference arm for Qwen3-VL: transformers' Qwen3VLForConditionalGeneration (float32,
always) with Qwen3VLProcessor, asked the question ffai asks and shown what ffai shows
(``reference_inputs``): a still resized to the same pixel budget, a window as its own clip (its
frames with their times from the window's start, the processor's own sampling off). The ``clip``
case decodes the same windows with ``ffai.media.Decoder.sample_frames``
(``ffai.bench.cases.clip_items``) and calls processor + generate per window."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ffai.bench.transformers_arm import TransformersArm
from ffai.engines.contract import DecodingOptions, Request
from ffai.engines.qwen3vl.engine import check_presentation, processor_config, prompt_text
from ffai.errors import ModelError

MISSING_REFERENCE = "the reference arm needs transformers and torchvision: pip install 'ffai[reference]'"


def require_transformers() -> None:
    """Fail early, in one line, when transformers or torchvision (Qwen3VLProcessor's video
    processor needs it, even for stills) is not installed."""
    try:
        found = all(importlib.util.find_spec(name) is not None for name in ("transformers", "torchvision"))
    except (ImportError, ValueError):  # a broken install, or sys.modules[name] = None
        found = False
    if not found:
        raise ModelError(MISSING_REFERENCE)


def reference_inputs(processor, model_dir: Path, images, times, span, options: DecodingOptions):
    """transformers' processor inputs for one request as ffai presents it: a still with the
    image budget in ``size``; a window as one clip (``VideoMetadata`` at 1 fps, so a frame's
    index is its time in seconds from the window's start; a lone frame doubled, as ffai doubles
    it) with the clip's budget in ``size``, the processor's per-frame cap off."""
    from ffai.engines.qwen3vl.video_frames import clip_frames

    still = times is None
    text = prompt_text(options, still=still)
    kind = "image" if still else "video"
    content = [{"type": kind}, {"type": "text", "text": text}]
    chat = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    if still:
        budget = processor_config(model_dir, options).image
        size = {"shortest_edge": budget.min_pixels, "longest_edge": budget.max_pixels}
        return processor(text=chat, images=list(images), size=size, return_tensors="pt")
    from transformers.video_utils import VideoMetadata

    check_presentation(options)
    budget = processor_config(model_dir, options, len(images)).video
    size = {"shortest_edge": budget.min_pixels, "longest_edge": budget.max_pixels}
    frames, clip_times = clip_frames(images, times, span[0])
    metadata = VideoMetadata(total_num_frames=len(frames), fps=1.0, frames_indices=list(clip_times))
    return processor(
        text=chat,
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        cap_pixels_per_frame=False,
        size=size,
        return_tensors="pt",
    )


class ReferenceArm(TransformersArm):
    def load(self) -> None:
        try:
            import torch
            from transformers import AutoProcessor, Qwen3VLForConditionalGeneration
        except ImportError as e:
            raise ModelError(MISSING_REFERENCE) from e
        # The same cores ffai plans its placement and threads for, all given to the one process.
        torch.set_num_threads(self.cores)
        model = Qwen3VLForConditionalGeneration.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self.loaded(model, AutoProcessor.from_pretrained(self.model_dir))

    def inputs(self, request: Request, options: DecodingOptions):
        return reference_inputs(self.processor, self.model_dir, request.images, request.times, request.span, options)

    def info(self) -> dict:
        import torch

        return {
            "torch_threads": {"main": torch.get_num_threads()},
            "image_processor": type(self.processor.image_processor).__name__,
            "video_processor": type(self.processor.video_processor).__name__,
        }
