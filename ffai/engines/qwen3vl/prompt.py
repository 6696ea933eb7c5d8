"""Prompts for Qwen3-VL, token-identical to transformers' ``Qwen3VLProcessor`` (5.25).

The checkpoint's chat template renders one user message holding the pictures then the text; a
picture renders as ``<|vision_start|><|image_pad|><|vision_end|>`` and a video as
``<|vision_start|><|video_pad|><|vision_end|>``. The processor then replaces each placeholder:

- ``<|image_pad|>`` by one ``<|image_pad|>`` per merge window of the still (t * h * w / 4);
- the video's whole ``<|vision_start|><|video_pad|><|vision_end|>`` by, per frame pair,
  ``<{time:.1f} seconds>`` then ``<|vision_start|>``, the pair's ``<|video_pad|>`` tokens and
  ``<|vision_end|>``: each pair brings its own start and end, so the template's pair around them
  goes (5.24 kept it, and a video's text opened with two vision starts; 5.25 dropped it as a bug).
  A template that writes the video token bare has it replaced alone.

The whole string is tokenised by the checkpoint's ``tokenizer.json`` with no special tokens
added (its post-processor adds none; the template writes ``<|im_start|>`` itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ffai.errors import UsageError
from ffai.kit.tokenizing import ChatPrompts

from .preprocess import ProcessorConfig
from .video_frames import pair_times, video_grid, widest_video_tokens

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer


IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VIDEO_WRAPPED = VISION_START + VIDEO_PAD + VISION_END  # the template's video, replaced whole
IM_END = "<|im_end|>"
# Tokens the prompt and the model need: a tokenizer without them is not a Qwen3-VL tokenizer.
REQUIRED_TOKENS = (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END, "<|im_start|>", IM_END)
QWEN_ONLY = " (not a Qwen3-VL tokenizer)"


def timestamp(seconds: float) -> str:
    """A frame pair's time as the prompt writes it (one decimal, Python's rounding of the float)."""
    return f"<{seconds:.1f} seconds>"


class PromptBuilder(ChatPrompts):
    """Chat template + placeholder expansion + tokeniser of one checkpoint."""

    def __init__(self, tokenizer: Tokenizer, chat_template: Any, eos_ids: tuple[int, ...], source: Path):
        super().__init__(tokenizer, chat_template, eos_ids, source)
        ids = {token: self.token_id(token, QWEN_ONLY) for token in REQUIRED_TOKENS}
        self.image_token_id = ids[IMAGE_PAD]
        self.video_token_id = ids[VIDEO_PAD]
        self.vision_start_id = ids[VISION_START]
        self.vision_end_id = ids[VISION_END]
        self.im_end_id = ids[IM_END]

    def render(self, content: list[dict], text: str, template: Any = None) -> str:
        for token in (IMAGE_PAD, VIDEO_PAD):
            if token in text:
                # The reference would take it for one more picture and fail; refuse it plainly.
                raise UsageError(f"the prompt must not contain {token}")
        return super().render(content, text, template)

    def build_images(self, grids: Sequence[tuple[int, int, int]], text: str, cfg: ProcessorConfig) -> list[int]:
        """Token ids of the prompt for stills with these (t, h, w) grids (``Pictures.grids``) and ``text``."""
        pieces = self.split(self.render([{"type": "image"}] * len(grids), text), IMAGE_PAD, len(grids))
        expanded = [pieces[0]]
        for grid, piece in zip(grids, pieces[1:]):
            expanded += [IMAGE_PAD * cfg.tokens(grid), piece]
        return self.encode("".join(expanded))

    def build_video(
        self, grid: tuple[int, int, int], times: Sequence[float], text: str, cfg: ProcessorConfig
    ) -> list[int]:
        """Token ids of the prompt for one clip with this (t, h, w) grid whose frames are at
        ``times`` (seconds from the clip's start, ``video_frames.clip_frames``), and ``text``."""
        pairs = pair_times(times, cfg.temporal_patch_size)
        if len(pairs) != grid[0]:
            raise ValueError(f"{len(times)} frame times make {len(pairs)} pairs, the grid has {grid[0]}")
        per_pair = VIDEO_PAD * cfg.tokens((1, grid[1], grid[2]))
        clip = "".join(f"{timestamp(t)}{VISION_START}{per_pair}{VISION_END}" for t in pairs)
        rendered = self.render([{"type": "video"}], text)
        placeholder = VIDEO_WRAPPED if VIDEO_WRAPPED in rendered else VIDEO_PAD
        before, after = self.split(rendered, placeholder, 1)
        return self.encode(before + clip + after)

    def count_tokens(
        self, n_frames: int, height: int, width: int, text: str, times: Sequence[float], cfg: ProcessorConfig
    ) -> int:
        """Length of a window's prompt: ``n_frames`` frames of ``height`` x ``width`` at ``times``
        (seconds from the window's start; digits cost tokens, so pass the widest a window can
        have), without pixels. Tokenising is cheap next to the model, and counting any other
        way could miss a merge the tokenizer makes."""
        n = max(n_frames, 2)  # a lone frame is doubled (video_frames.clip_frames)
        times = list(times) * 2 if n_frames == 1 else list(times)
        if len(times) != n:
            raise ValueError(f"{n_frames} frames with {len(times)} times")
        return len(self.build_video(video_grid(n_frames, height, width, cfg), times, text, cfg))

    def count_widest(self, n_frames: int, text: str, widest_time: float, cfg: ProcessorConfig) -> int:
        """At least the length of any window prompt of ``n_frames`` frames, whatever their size,
        with clip times of at most as many digits as ``widest_time``: the prompt's text at that
        time, plus ``widest_video_tokens``. ``<|video_pad|>`` is a special token, so the text's
        tokens do not depend on how many pads stand between them."""
        n = max(n_frames, 2)  # a lone frame is doubled
        pairs = (n + -n % cfg.temporal_patch_size) // cfg.temporal_patch_size
        one_pad = (pairs, cfg.merge_size, cfg.merge_size)  # a grid of one merge window per pair
        text_tokens = len(self.build_video(one_pad, [widest_time] * n, text, cfg)) - pairs
        return text_tokens + widest_video_tokens(n_frames, cfg)

    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a caption: generation_config.json's eos ids (<|im_end|>, <|endoftext|>),
        else <|im_end|>, the end of the assistant's turn."""
        return self._eos_ids or (self.im_end_id,)
