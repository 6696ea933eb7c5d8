"""Prompts for Qwen3-VL, token-identical to transformers' ``Qwen3VLProcessor`` (5.24).

The checkpoint's chat template renders one user message holding the pictures then the text; a
picture renders as ``<|vision_start|><|image_pad|><|vision_end|>`` and a video as
``<|vision_start|><|video_pad|><|vision_end|>``. The processor then replaces each placeholder:

- ``<|image_pad|>`` by one ``<|image_pad|>`` per merge window of the still (t * h * w / 4);
- ``<|video_pad|>`` by, per frame pair, ``<{time:.1f} seconds>`` then ``<|vision_start|>``, the
  pair's ``<|video_pad|>`` tokens and ``<|vision_end|>``, all inside the template's own
  ``<|vision_start|>`` ... ``<|vision_end|>`` (so a video's text opens with two vision starts, as
  the reference writes it).

The whole string is tokenised by the checkpoint's ``tokenizer.json`` with no special tokens
added (its post-processor adds none; the template writes ``<|im_start|>`` itself).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ffai.errors import ModelError, UsageError

from .config import read_json_object
from .preprocess import ProcessorConfig
from .video_frames import pair_times, video_grid, widest_video_tokens

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# Where a chat template may live, in the order transformers' processor looks.
CHAT_TEMPLATE_SOURCES = (
    ("chat_template.json", "json"),
    ("chat_template.jinja", "raw"),
    ("tokenizer_config.json", "json"),
)

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IM_END = "<|im_end|>"
# Tokens the prompt and the model need: a tokenizer without them is not a Qwen3-VL tokenizer.
REQUIRED_TOKENS = (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END, "<|im_start|>", IM_END)
REPLACEMENT_CHARACTER = "\ufffd"  # what decoding writes for bytes that are no whole character


def timestamp(seconds: float) -> str:
    """A frame pair's time as the prompt writes it (one decimal, Python's rounding of the float)."""
    return f"<{seconds:.1f} seconds>"


class PromptBuilder:
    """Chat template + placeholder expansion + tokeniser of one checkpoint."""

    def __init__(self, tokenizer: Tokenizer, chat_template: Any, eos_ids: tuple[int, ...], source: Path):
        self._tokenizer = tokenizer
        self._template = chat_template  # a compiled jinja2 template
        self._source = source
        ids = {token: _require_token(tokenizer, token, source) for token in REQUIRED_TOKENS}
        self.image_token_id = ids[IMAGE_PAD]
        self.video_token_id = ids[VIDEO_PAD]
        self.vision_start_id = ids[VISION_START]
        self.vision_end_id = ids[VISION_END]
        self.im_end_id = ids[IM_END]
        self._eos_ids = eos_ids

    @classmethod
    def from_dir(cls, model_dir: Path) -> PromptBuilder:
        """The checkpoint's builder, one per process while its files are unchanged (Qwen's
        tokenizer is ~11 MB of JSON; the stages of one process share it)."""
        model_dir = Path(model_dir).resolve()
        return _shared_builder(cls, model_dir, _files_stamp(model_dir))

    @classmethod
    def load(cls, model_dir: Path) -> PromptBuilder:
        """A new builder read from ``model_dir``'s files (``from_dir`` shares one)."""
        model_dir = Path(model_dir)
        tokenizer = _load_tokenizer(model_dir / TOKENIZER_FILE)
        template = _compile_template(*_find_chat_template(model_dir))
        eos_ids = _generation_eos_ids(model_dir / GENERATION_CONFIG_FILE)
        return cls(tokenizer, template, eos_ids, model_dir / TOKENIZER_FILE)

    def render(self, content: list[dict], text: str) -> str:
        """The chat template's text for one user turn: ``content`` (pictures), then ``text``."""
        for token in (IMAGE_PAD, VIDEO_PAD):
            if token in text:
                # The reference would take it for one more picture and fail; refuse it plainly.
                raise UsageError(f"the prompt must not contain {token}")
        messages = [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]
        try:
            return self._template.render(messages=messages, tools=None, documents=None, add_generation_prompt=True)
        except Exception as e:  # a template is code from the checkpoint: any failure is the checkpoint's
            raise ModelError(f"{self._source.parent}: chat template failed: {e}") from e

    def build_images(self, grids: Sequence[tuple[int, int, int]], text: str, cfg: ProcessorConfig) -> list[int]:
        """Token ids of the prompt for stills with these (t, h, w) grids (``Pictures.grids``) and ``text``."""
        pieces = self._split(self.render([{"type": "image"}] * len(grids), text), IMAGE_PAD, len(grids))
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
        before, after = self._split(self.render([{"type": "video"}], text), VIDEO_PAD, 1)
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

    def encode(self, prompt: str) -> list[int]:
        return self._tokenizer.encode(prompt, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, special tokens dropped (the reference's batch_decode with
        skip_special_tokens=True; clean_up_tokenization_spaces is false for this tokenizer)."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def text_stream(self) -> TextStream:
        """An incremental ``decode`` for one answer, fed one generated id at a time."""
        return TextStream(self.decode)

    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a caption: generation_config.json's eos ids (<|im_end|>, <|endoftext|>),
        else <|im_end|>, the end of the assistant's turn."""
        return self._eos_ids or (self.im_end_id,)

    def _split(self, rendered: str, placeholder: str, count: int) -> list[str]:
        pieces = rendered.split(placeholder)
        if len(pieces) != count + 1:
            raise ModelError(
                f"{self._source.parent}: chat template wrote {len(pieces) - 1} {placeholder} for {count} pictures"
            )
        return pieces


class TextStream:
    """Generated ids in, the answer's text out piece by piece, each piece final.

    A byte-level token may hold part of a character, so the text of the ids so far can end in an
    incomplete UTF-8 sequence (decoded as U+FFFD) that a later token completes. As tokenizers'
    ``DecodeStream`` does, each step decodes only the ids since the last piece together with
    that piece's ids, and gives new text only once it does not end in U+FFFD; the pieces, then
    ``finish()``, add up to ``decode`` of all the ids.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] made the last piece; everything before is shown
        self._read = 0  # ids from here on are not shown yet

    def step(self, token_id: int) -> str:
        """The text that ``token_id`` makes final ("" while it may still change)."""
        self._ids.append(token_id)
        shown = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(shown) or text.endswith(REPLACEMENT_CHARACTER):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(shown) :]

    def finish(self) -> str:
        """What the last ids hold back at the end (an incomplete character decodes as U+FFFD)."""
        shown = self._decode(self._ids[self._prefix : self._read])
        rest = self._decode(self._ids[self._prefix :])[len(shown) :]
        self._prefix = self._read = len(self._ids)
        return rest


@functools.lru_cache(maxsize=4)
def _shared_builder(cls: type[PromptBuilder], model_dir: Path, stamp: tuple) -> PromptBuilder:
    return cls.load(model_dir)  # a failure raises and is not kept: the next call reads again


def _files_stamp(model_dir: Path) -> tuple:
    """Size and modification time of every file a builder reads, so an edited checkpoint is read
    again rather than served from memory."""
    stamp = []
    for name in (TOKENIZER_FILE, GENERATION_CONFIG_FILE, *(name for name, _ in CHAT_TEMPLATE_SOURCES)):
        try:
            st = (model_dir / name).stat()
        except OSError:
            stamp.append((name, None))
        else:
            stamp.append((name, st.st_size, st.st_mtime_ns))
    return tuple(stamp)


def _load_tokenizer(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ModelError(f"{path}: not found")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise ModelError(f"{path}: cannot load tokenizer: {e}") from e


def _require_token(tokenizer: Tokenizer, token: str, source: Path) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ModelError(f"{source}: missing token {token} (not a Qwen3-VL tokenizer)")
    return token_id


def _find_chat_template(model_dir: Path) -> tuple[str, Path]:
    for name, kind in CHAT_TEMPLATE_SOURCES:
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            template = text if kind == "raw" else json.loads(text).get("chat_template")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise ModelError(f"{path}: cannot read: {e}") from e
        if isinstance(template, str):
            return template, path
        if template is not None:
            raise ModelError(f"{path}: chat_template must be one string")
    raise ModelError(f"{model_dir}: no chat template (looked in {', '.join(n for n, _ in CHAT_TEMPLATE_SOURCES)})")


def _compile_template(source: str, path: Path) -> Any:
    """Compile in a sandbox configured as transformers does (trim_blocks, lstrip_blocks, loop
    controls, a non-escaping tojson, raise_exception)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as e:
        raise ModelError(f"{path}: chat template does not compile: {e}") from e


def _generation_eos_ids(path: Path) -> tuple[int, ...]:
    """eos_token_id of generation_config.json (an int or a list); none when the file is absent."""
    if not path.is_file():
        return ()
    eos = read_json_object(path, "generation config").get("eos_token_id")
    if eos is None:
        return ()
    ids = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ModelError(f"{path}: eos_token_id must be an id or a list of ids, got {eos!r}")
    return tuple(ids)
