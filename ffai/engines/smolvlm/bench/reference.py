"""The bench's reference arm for SmolVLM: transformers' Idefics3ForConditionalGeneration (float32,
always) with its PIL processor, or for a SmolVLM2 checkpoint SmolVLMForConditionalGeneration with
SmolVLMProcessor, asked the same question ffai asks and shown a window as ffai shows it (a video
where the checkpoint knows video, ``reference_inputs``); the ``clip`` case decodes the same
windows with ``ffai.media.Decoder.sample_frames`` (``ffai.bench.cases.clip_items``) and calls
processor + generate per window."""

from __future__ import annotations

from pathlib import Path

from ffai.bench.transformers_arm import TransformersArm
from ffai.engines.contract import DecodingOptions, Request
from ffai.engines.smolvlm.bench.checkpoints import WRITER
from ffai.engines.smolvlm.engine import prompt_text, window_presentation


def reference_inputs(processor, images, times, span, options: DecodingOptions, model_dir: Path):
    """transformers' processor inputs for one request as ffai presents it: a still tiled, a window
    as separate pictures, or a window as one video clip (``SmolVLMProcessor``): its frames passed
    with their times from the window's start (``VideoMetadata`` at 1 fps, so a frame's index is its
    time in seconds) and the window's span as the clip's duration."""
    n = len(images)
    still = times is None
    video = not still and window_presentation(options, hasattr(processor, "video_processor"), model_dir) == "video"
    text = prompt_text(options, n, still=still, video=video)
    if video:
        from transformers.video_utils import VideoMetadata

        start, end = span
        metadata = VideoMetadata(
            total_num_frames=n, fps=1.0, duration=end - start, frames_indices=[t - start for t in times]
        )
        content = [{"type": "video"}, {"type": "text", "text": text}]
        chat = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        return processor(text=chat, videos=[list(images)], video_metadata=[metadata], return_tensors="pt")
    content = [{"type": "image"}] * n + [{"type": "text", "text": text}]
    chat = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return processor(text=chat, images=list(images), return_tensors="pt", do_image_splitting=still)


class ReferenceArm(TransformersArm):
    writer = WRITER

    def inputs(self, request: Request, options: DecodingOptions):
        return reference_inputs(self.processor, request.images, request.times, request.span, options, self.model_dir)
