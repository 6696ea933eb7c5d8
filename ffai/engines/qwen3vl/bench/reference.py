"""The bench's reference arm for Qwen3-VL: transformers' Qwen3VLForConditionalGeneration (float32,
always) with Qwen3VLProcessor, asked the question ffai asks and shown what ffai shows
(``reference_inputs``): a still resized to the same pixel budget, a window as its own clip (its
frames with their times from the window's start, the processor's own sampling off). The ``clip``
case decodes the same windows with ``ffai.media.Decoder.sample_frames``
(``ffai.bench.cases.clip_items``) and calls processor + generate per window."""

from __future__ import annotations

from pathlib import Path

from ffai.bench.transformers_arm import TransformersArm
from ffai.engines.contract import DecodingOptions, Request
from ffai.engines.qwen3vl.bench.checkpoints import WRITER
from ffai.engines.qwen3vl.engine import check_presentation, processor_config, prompt_text


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
    writer = WRITER
    packages = ("transformers", "torchvision")  # Qwen3VLProcessor's video processor needs torchvision, even for stills

    def inputs(self, request: Request, options: DecodingOptions):
        return reference_inputs(self.processor, self.model_dir, request.images, request.times, request.span, options)
