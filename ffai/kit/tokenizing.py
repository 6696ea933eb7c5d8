"""A checkpoint's tokenizer files, read as transformers reads them, for every engine: the
``tokenizers`` tokenizer, the chat template (found where the processor looks, compiled in
transformers' sandbox), generation_config's eos ids, and ``TextStream``, the incremental decode
that streams an answer (``generate_streamed``). tokenizers and jinja2 load on first use, so importing this stays light."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ffai.errors import ModelError
from ffai.kit.config_json import read_json_object

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
REPLACEMENT_CHARACTER = "\ufffd"  # what decoding writes for bytes that are no whole character


class TextStream:
    """Generated ids in, the answer's text out piece by piece, each piece final.

    A byte-level token may hold part of a character, so the text of the ids so far can end in
    an incomplete UTF-8 sequence (decoded as U+FFFD) that a later token completes. As tokenizers'
    ``DecodeStream`` and text-generation-inference do, each step decodes only the few ids since
    the last piece, together with the ids of that piece (``_prefix`` .. ``_read``: decoders that
    treat a sequence's first token apart, such as Metaspace dropping its leading space, then see
    it as they would in the whole), and gives the new text only once it does not end in U+FFFD.
    Text shown ends on a whole character, so the text of later ids simply follows it: the
    pieces, then ``finish()``, add up to ``decode`` of all the ids (tested with multi-byte
    characters split across tokens). Decoding a handful of ids a step keeps it cheap.
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


def generate_streamed(
    generate: Callable[[Callable[[int], None]], list[int]], stream: TextStream, on_text: Callable[[str], None]
) -> list[int]:
    """``generate(on_token)``'s ids, each piece of their text given to ``on_text`` as soon as
    ``stream`` makes it final, the held-back rest at the end: the pieces add up to the decode."""

    def on_token(token_id: int) -> None:
        if piece := stream.step(token_id):
            on_text(piece)

    ids = generate(on_token)
    if rest := stream.finish():
        on_text(rest)
    return ids


def files_stamp(model_dir: Path) -> tuple:
    """Size and modification time of every file a prompt builder reads, so an edited checkpoint
    is read again rather than served from memory."""
    stamp = []
    for name in (TOKENIZER_FILE, GENERATION_CONFIG_FILE, *(name for name, _ in CHAT_TEMPLATE_SOURCES)):
        try:
            st = (model_dir / name).stat()
        except OSError:
            stamp.append((name, None))
        else:
            stamp.append((name, st.st_size, st.st_mtime_ns))
    return tuple(stamp)


def load_tokenizer(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ModelError(f"{path}: not found")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise ModelError(f"{path}: cannot load tokenizer: {e}") from e


def require_token(tokenizer: Tokenizer, token: str, source: Path, why: str = "") -> int:
    """The id of ``token``, or a ModelError naming ``source`` (``why`` follows, e.g. which
    tokenizer it is not)."""
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ModelError(f"{source}: missing token {token}{why}")
    return token_id


def find_chat_template(model_dir: Path) -> tuple[str, Path]:
    """The chat template's source and the file it came from."""
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


def compile_template(source: str, path: Path) -> Any:
    """Compile in a sandbox configured as transformers does (trim_blocks, lstrip_blocks,
    loop controls, a non-escaping tojson, raise_exception)."""
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


def generation_eos_ids(path: Path) -> tuple[int, ...]:
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


def read_prompt_files(model_dir: Path) -> tuple[Tokenizer, Any, tuple[int, ...], Path]:
    """What a prompt builder is made of: the tokenizer, the compiled chat template, the eos ids,
    and the tokenizer's path (which errors about its tokens name)."""
    tokenizer = load_tokenizer(model_dir / TOKENIZER_FILE)
    template = compile_template(*find_chat_template(model_dir))
    eos_ids = generation_eos_ids(model_dir / GENERATION_CONFIG_FILE)
    return tokenizer, template, eos_ids, model_dir / TOKENIZER_FILE


class ChatPrompts:
    """A checkpoint's chat template and tokenizer, shared by every engine's prompt builder: one user
    turn rendered, tokenised with no special tokens added (the templates write their own), the
    answer's ids decoded as the reference's ``batch_decode(skip_special_tokens=True)`` does (no
    clean-up of spaces: the tokenizers here set none) and streamed (``text_stream``). An engine's
    builder adds how its pictures' placeholders expand and which ids stop an answer
    (``stop_ids``)."""

    def __init__(self, tokenizer: Tokenizer, chat_template: Any, eos_ids: tuple[int, ...], source: Path) -> None:
        self._tokenizer = tokenizer
        self._template = chat_template  # a compiled jinja2 template
        self._source = source
        self._eos_ids = eos_ids

    @classmethod
    def from_dir(cls, model_dir: Path):
        """The checkpoint's builder, one per process while its files are unchanged: a builder is
        never changed after it is made, and a tokenizer is megabytes resident (more while it
        parses), which the stages of one process (the window check, preprocess, text) would
        otherwise each load again."""
        model_dir = Path(model_dir).resolve()
        return _shared_builder(cls, model_dir, files_stamp(model_dir))

    @classmethod
    def load(cls, model_dir: Path):
        """A new builder read from ``model_dir``'s files (``from_dir`` shares one)."""
        return cls(*read_prompt_files(Path(model_dir)))

    def token_id(self, token: str, why: str = "") -> int:
        """The id of ``token``, or a ModelError naming the tokenizer file."""
        return require_token(self._tokenizer, token, self._source, why)

    def render(self, content: list[dict], text: str, template: Any = None) -> str:
        """The chat template's text (``template``, else the checkpoint's) for one user turn:
        ``content`` (pictures, videos), then ``text``."""
        messages = [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]
        try:
            return (template or self._template).render(
                messages=messages, tools=None, documents=None, add_generation_prompt=True
            )
        except Exception as e:  # a template is code from the checkpoint: any failure is the checkpoint's
            raise ModelError(f"{self._source.parent}: chat template failed: {e}") from e

    def split(self, rendered: str, placeholder: str, count: int, what: str = "pictures") -> list[str]:
        """``rendered`` cut at its ``count`` placeholders, or a ModelError where the template wrote
        another number of them."""
        pieces = rendered.split(placeholder)
        if len(pieces) != count + 1:
            raise ModelError(
                f"{self._source.parent}: chat template wrote {len(pieces) - 1} {placeholder} placeholders for {count} {what}"
            )
        return pieces

    def encode(self, prompt: str) -> list[int]:
        return self._tokenizer.encode(prompt, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, special tokens dropped."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def text_stream(self) -> TextStream:
        """An incremental ``decode`` for one answer, fed one generated id at a time."""
        return TextStream(self.decode)

    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end an answer: generation_config.json's eos ids."""
        return self._eos_ids


@functools.lru_cache(maxsize=4)
def _shared_builder(cls: type, model_dir: Path, stamp: tuple):
    return cls.load(model_dir)  # a failure raises and is not kept: the next call reads again
