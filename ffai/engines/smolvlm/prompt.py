"""Prompt building for SmolVLM (Idefics3), token-identical to transformers.

Follows ``Idefics3Processor`` (transformers 5.24): the checkpoint's chat template renders one
user message holding the images then the text, each ``<image>`` placeholder is expanded into
the tile layout of its image (``replace_image_token``), and the whole string is tokenised by
the checkpoint's ``tokenizer.json`` with no special tokens added (the template writes
``<|im_start|>`` itself; the tokenizer has no post-processor).

A window presented as a video follows ``SmolVLMProcessor`` (SmolVLM2): the processor's own
video chat template (``VIDEO_CHAT_TEMPLATE``, which it uses for any message holding a video)
renders one ``<video>`` placeholder, expanded into an introduction that counts the frames in
words (``num2words``) and gives the clip's duration, then each frame's time and its image tokens
(``replace_video_token``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ffai.errors import UsageError
from ffai.kit.tokenizing import ChatPrompts, compile_template

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

IMAGE = "<image>"
FAKE_AROUND_IMAGE = "<fake_token_around_image>"
GLOBAL_IMAGE = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
VIDEO = "<video>"
# transformers 5.24 processing_smolvlm.py: DEFAULT_CHAT_TEMPLATE (what apply_chat_template renders
# a message holding a video with: the checkpoints' own templates know images only),
# DEFAULT_VIDEO_INTRO, FRAME_TIMESTAMP_MESSAGE and DEFAULT_MEDIA_OUTTRO.
VIDEO_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'] is string %}"
    "{{': ' + message['content']}}{% else %}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}"
    "{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
VIDEO_INTRO = "You are provided the following series of {frame_count} frames from a {video_duration} [H:MM:SS] video.\n"
FRAME_TIMESTAMP = "\nFrame from {timestamp}:"
MEDIA_OUTTRO = "\n\n"
MAX_GRID = 6  # the tokenizer has <row_r_col_c> for r, c in 1..6


def tile_tag(row: int, col: int) -> str:
    return f"<row_{row}_col_{col}>"


def expand_image(grid: tuple[int, int], image_seq_len: int) -> str:
    """The text that replaces one ``<image>`` placeholder: per tile a fake token, its row/col
    tag and ``image_seq_len`` image tokens, rows ended by a newline; then a blank line and the
    global image wrapped in fake tokens. An unsplit image (0, 0) is the global part alone."""
    rows, cols = grid
    image_tokens = IMAGE * image_seq_len
    global_part = f"{FAKE_AROUND_IMAGE}{GLOBAL_IMAGE}{image_tokens}{FAKE_AROUND_IMAGE}"
    if rows == 0 and cols == 0:
        return global_part
    tile_rows = (
        "".join(f"{FAKE_AROUND_IMAGE}{tile_tag(r, c)}{image_tokens}" for c in range(1, cols + 1)) + "\n"
        for r in range(1, rows + 1)
    )
    return "".join(tile_rows) + "\n" + global_part


def expand_video(times: Sequence[float], duration: float, image_seq_len: int) -> str:
    """The text that replaces the ``<video>`` placeholder for frames at ``times`` (seconds from
    the clip's start) of a clip lasting ``duration`` seconds: the count in words, the duration
    as H:MM:SS, then per frame its MM:SS (minutes past 59 keep counting) and its image tokens."""
    from datetime import timedelta

    from num2words import num2words

    text = VIDEO_INTRO.format(frame_count=num2words(len(times)), video_duration=str(timedelta(seconds=int(duration))))
    for second in times:
        timestamp = f"{int(second // 60):02d}:{int(second % 60):02d}"
        text += FRAME_TIMESTAMP.format(timestamp=timestamp) + expand_image((0, 0), image_seq_len)
    return text + MEDIA_OUTTRO


class PromptBuilder(ChatPrompts):
    """Chat template + image expansion + tokeniser of one checkpoint."""

    def __init__(self, tokenizer: Tokenizer, chat_template: Any, eos_ids: tuple[int, ...], source: Path):
        super().__init__(tokenizer, chat_template, eos_ids, source)
        self.image_token_id = self.token_id(IMAGE)
        self.end_of_utterance_id = self.token_id(END_OF_UTTERANCE)
        self.token_id(FAKE_AROUND_IMAGE)
        self.token_id(GLOBAL_IMAGE)
        for r in range(1, MAX_GRID + 1):
            for c in range(1, MAX_GRID + 1):
                self.token_id(tile_tag(r, c))

    def build(self, grids: Sequence[tuple[int, int]], text: str, image_seq_len: int) -> list[int]:
        """Token ids of the prompt for images with these grids (see preprocess) and ``text``."""
        if IMAGE in text:
            # The reference would take it for one more image and fail; refuse it plainly.
            raise UsageError(f"the prompt must not contain {IMAGE}")
        pieces = self.split(self.render([{"type": "image"}] * len(grids), text), IMAGE, len(grids), "images")
        expanded = [pieces[0]]
        for grid, piece in zip(grids, pieces[1:]):
            expanded += [expand_image(grid, image_seq_len), piece]
        return self.encode("".join(expanded))

    def build_video(self, times: Sequence[float], duration: float, text: str, image_seq_len: int) -> list[int]:
        """Token ids of the prompt for one clip (see ``expand_video``) and ``text``."""
        for token in (IMAGE, VIDEO):
            if token in text:
                raise UsageError(f"the prompt must not contain {token}")
        before, after = self.render([{"type": "video"}], text, _video_template()).split(VIDEO)
        return self.encode(before + expand_video(times, duration, image_seq_len) + after)

    def count_tokens(self, grids: Sequence[tuple[int, int]], text: str, image_seq_len: int) -> int:
        # Tokenising is cheap next to the model; counting any other way could miss a merge
        # such as "\n\n" that some tokenizers make one token.
        return len(self.build(grids, text, image_seq_len))

    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a caption: <end_of_utterance>, then generation_config's eos ids."""
        return tuple(dict.fromkeys([self.end_of_utterance_id, *self._eos_ids]))


@functools.cache
def _video_template() -> Any:
    return compile_template(VIDEO_CHAT_TEMPLATE, Path(__file__))
