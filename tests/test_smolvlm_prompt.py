"""SmolVLM prompt building: template, image expansion, stop ids, checkpoint errors, and
gate 2 against transformers (``Idefics3Processor`` input ids and decoding)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from ffai.engines.smolvlm.bench.checkpoints import REFERENCE_DIR as SMOLVLM_FILES
from ffai.engines.smolvlm.preprocess import ProcessorConfig, preprocess_images
from ffai.engines.smolvlm.prompt import PromptBuilder, expand_image
from ffai.errors import ModelError, UsageError

MODEL_DIR = SMOLVLM_FILES
DEFAULT_TEXT = "Describe this image."
CUSTOM_TEXT = "  Qu'est-ce qui est écrit ici ? 看板には何と書いてありますか ✓\nAnswer briefly.  "
IMAGE_ID, FAKE_ID, GLOBAL_ID, ROW_1_COL_1_ID, EOU_ID = 49190, 49189, 49152, 49153, 49279


@pytest.fixture(scope="module")
def builder() -> PromptBuilder:
    return PromptBuilder.from_dir(MODEL_DIR)


@pytest.fixture(scope="module")
def reference():
    transformers = pytest.importorskip("transformers")
    return transformers.Idefics3Processor.from_pretrained(MODEL_DIR)


def test_token_ids(builder):
    assert (builder.image_token_id, builder.end_of_utterance_id) == (IMAGE_ID, EOU_ID)
    assert builder.stop_ids() == (EOU_ID,)  # generation_config's eos is <end_of_utterance> too


def test_render_matches_checkpoint_notes(builder):
    # Rendered strings recorded in ffai/engines/smolvlm/bench/files/smolvlm-256m-instruct/SOURCES.md.
    assert (
        builder.render([{"type": "image"}], DEFAULT_TEXT)
        == "<|im_start|>User:<image>Describe this image.<end_of_utterance>\nAssistant:"
    )
    assert builder.render([], "Hi") == "<|im_start|>User: Hi<end_of_utterance>\nAssistant:"


def test_unsplit_layout(builder):
    ids = builder.build([(0, 0)], DEFAULT_TEXT, 3)
    assert ids == [1, 11126, 42, FAKE_ID, GLOBAL_ID, IMAGE_ID, IMAGE_ID, IMAGE_ID, FAKE_ID,
                   37964, 451, 2443, 30, EOU_ID, 198, 9519, 9531, 42]  # fmt: skip


def test_split_layout(builder):
    text = expand_image((2, 3), 2)
    assert text.count("<image>") == (2 * 3 + 1) * 2
    assert text.startswith("<fake_token_around_image><row_1_col_1><image><image><fake_token_around_image><row_1_col_2>")
    assert "<row_1_col_3><image><image>\n<fake_token_around_image><row_2_col_1>" in text
    assert text.endswith(
        "<row_2_col_3><image><image>\n\n<fake_token_around_image><global-img><image><image><fake_token_around_image>"
    )
    ids = builder.build([(2, 3), (0, 0)], DEFAULT_TEXT, 64)
    assert ids.count(IMAGE_ID) == (2 * 3 + 1 + 1) * 64
    assert ids.count(ROW_1_COL_1_ID) == 1 and ids.count(GLOBAL_ID) == 2
    assert builder.count_tokens([(2, 3), (0, 0)], DEFAULT_TEXT, 64) == len(ids)


def test_image_token_in_text_refused(builder):
    with pytest.raises(UsageError, match="<image>"):
        builder.build([(0, 0)], "what is <image>?", 64)


def test_decode_drops_special_tokens(builder):
    assert (
        builder.decode([1, 11126, 42, FAKE_ID, IMAGE_ID, 37964, 451, 2443, 30, EOU_ID]) == "User:Describe this image."
    )


def _model_dir(tmp_path: Path, *names: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(MODEL_DIR / name, tmp_path / name)
    return tmp_path


def test_tokenizer_without_image_token(tmp_path):
    model_dir = _model_dir(tmp_path, "chat_template.json")
    tokenizer = json.loads((MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["content"] != "<global-img>"]
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    with pytest.raises(ModelError, match=r"tokenizer\.json.*<global-img>"):
        PromptBuilder.from_dir(model_dir)


def test_missing_tokenizer_or_template(tmp_path):
    with pytest.raises(ModelError, match=r"tokenizer\.json"):
        PromptBuilder.from_dir(_model_dir(tmp_path, "chat_template.json"))
    (tmp_path / "chat_template.json").unlink()
    _model_dir(tmp_path, "tokenizer.json")
    with pytest.raises(ModelError, match="no chat template"):
        PromptBuilder.from_dir(tmp_path)


def test_template_from_tokenizer_config_and_eos_list(tmp_path, builder):
    model_dir = _model_dir(tmp_path, "tokenizer.json", "tokenizer_config.json")
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, EOU_ID]}))
    fallback = PromptBuilder.from_dir(model_dir)
    assert fallback.build([(0, 0)], DEFAULT_TEXT, 64) == builder.build([(0, 0)], DEFAULT_TEXT, 64)
    assert fallback.stop_ids() == (EOU_ID, 2)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ModelError, match="generation_config.json"):
        PromptBuilder.from_dir(model_dir)
    (model_dir / "generation_config.json").write_text("[2]")
    with pytest.raises(ModelError, match=r"generation_config\.json: generation config must be a JSON object"):
        PromptBuilder.from_dir(model_dir)
    (model_dir / "generation_config.json").write_text("{")
    with pytest.raises(ModelError, match=r"generation_config\.json: cannot read generation config"):
        PromptBuilder.from_dir(model_dir)


def test_one_builder_per_checkpoint_until_its_files_change(tmp_path):
    # The stages of one process share the builder (its tokenizer is tens of MB); an edited
    # file is read again, and a folder that fails to load is not remembered as failing.
    model_dir = _model_dir(tmp_path / "a", "tokenizer.json", "chat_template.json")
    first = PromptBuilder.from_dir(model_dir)
    assert PromptBuilder.from_dir(model_dir) is first
    assert PromptBuilder.from_dir(f"{tmp_path}/./b/../a") is first  # the same folder, spelt otherwise
    assert PromptBuilder.from_dir(_model_dir(tmp_path / "b", "tokenizer.json", "chat_template.json")) is not first
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, EOU_ID]}))
    second = PromptBuilder.from_dir(model_dir)
    assert second is not first and second.stop_ids() == (EOU_ID, 2)
    template = model_dir / "chat_template.json"
    saved = template.read_bytes()
    template.unlink()
    with pytest.raises(ModelError):
        PromptBuilder.from_dir(model_dir)
    template.write_bytes(saved)
    assert PromptBuilder.from_dir(model_dir).build([(0, 0)], DEFAULT_TEXT, 64) == first.build(
        [(0, 0)], DEFAULT_TEXT, 64
    )


def _frame(width: int, height: int, shade: int) -> Image.Image:
    return Image.new("RGB", (width, height), (shade, 255 - shade, shade // 2))


CASES = {
    "unsplit": ([(64, 48)], False),
    "split-still": ([(700, 300)], True),
    "window-1": ([(64, 36)], False),
    "window-8": ([(64, 36)] * 8, False),
    "two-split-images": ([(700, 300), (48, 64)], True),
}


@pytest.mark.oracle
@pytest.mark.parametrize("text", [DEFAULT_TEXT, CUSTOM_TEXT], ids=["default", "custom"])
@pytest.mark.parametrize("case", CASES)
def test_gate2_prompt_ids(reference, builder, case, text):
    sizes, split = CASES[case]
    images = [_frame(w, h, 30 * i) for i, (w, h) in enumerate(sizes)]
    messages = [{"role": "user", "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]}]
    prompt = reference.apply_chat_template(messages, add_generation_prompt=True)
    expected = reference(text=prompt, images=images, do_image_splitting=split)["input_ids"][0]
    cfg = ProcessorConfig.from_dir(MODEL_DIR)
    grids = preprocess_images(images, cfg, split=split).grids
    assert builder.build(grids, text, cfg.image_seq_len) == list(expected)


@pytest.mark.oracle
def test_gate2_decode(reference, builder):
    id_lists = [
        [1, 11126, 42, FAKE_ID, GLOBAL_ID, IMAGE_ID, 37964, 451, 2443, 30, EOU_ID, 198, 9519, 9531, 42],
        reference.tokenizer(CUSTOM_TEXT)["input_ids"] + [EOU_ID, 2, 0],
        [198, 198, 271, 49200, 17, 30, 30, 30],
        [],
    ]
    assert [builder.decode(ids) for ids in id_lists] == reference.batch_decode(id_lists, skip_special_tokens=True)
