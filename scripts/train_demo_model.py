"""Train the bundled demo checkpoint, ``models/smolvlm-demo``: a tiny Idefics3 that captions the
synthetic scenes of ``ffai.bench.demo_scenes`` ("a red circle on a blue background").

No real weights can be shipped in the repository, so ``ffai caption`` needs a small model it can
run offline out of the box. This one is trained from scratch with transformers'
``Idefics3ForConditionalGeneration`` (the engine itself never imports transformers) and saved
with ``save_pretrained``, so its tensor names are those of the real checkpoint.

- Tokenizer: its own byte-level BPE, trained with ``tokenizers`` on the prompts and captions,
  with the special tokens and chat template of SmolVLM-256M-Instruct.
- Geometry: 64 px tiles, 8 px patches, scale factor 2 -> 16 image tokens per image. The
  preprocessor's ``size.longest_edge`` equals the tile, so a still (``split=True``) is one
  64 x 64 image exactly like a video frame: no tiles, no row/column tokens.
- Inputs are built by the engine's own code (``preprocess_images`` + ``PromptBuilder`` on the
  folder being written, prompt text from ``engine.prompt_text``), so training and inference see
  the same token ids and pixels. The loss covers only the answer and ``<end_of_utterance>``.
- Samples: stills (split path) and windows of 1-8 frames of one scene, still or moving, of
  both polarities (bright on dark, deep on light), drawn at a few near-square canvas sizes or
  at a random aspect ratio; geometry cells of the ``heldout`` split are never drawn.
- Two phases: the vision tower first learns shape/colour/background through a training-only
  label head on single frames (cheap, and the caption loss alone is slow to teach shapes),
  then the connector and text tower learn the captions with the vision tower frozen.

Usage: python scripts/train_demo_model.py [--out models/smolvlm-demo] [--seed 0] [--vision-steps N] [--steps N] [--eval-n N]
Writes the folder (atomically), its RECIPE.md and the manifest ``models/smolvlm-demo.toml``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ffai.bench import demo_eval, demo_scenes

REPO = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO / "ffai" / "engines" / "smolvlm" / "bench" / "files" / "smolvlm-256m-instruct"
DEFAULT_OUT = REPO / "ffai" / "models" / "bundled" / "smolvlm-demo"
MANIFEST_NAME = "smolvlm-demo"
DOC_FILE = "RECIPE.md"  # documentation: shipped in the folder, not pinned by the manifest

# Special tokens, in id order from 0. PromptBuilder requires every <row_r_col_c> for r, c in
# 1..6 even though this model never splits an image.
BASE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
IMAGE_SPECIALS = (
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
)
BPE_VOCAB = 512  # upper bound; the corpus runs out of merges well before


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the weights; written to RECIPE.md."""

    seed: int = 0
    # Phase 1: the vision tower alone, on single frames, with a training-only label head.
    vision_steps: int = 3000
    vision_batch: int = 32
    # Phase 2: connector + text tower on captions, the vision tower frozen.
    steps: int = 500
    batch: int = 32
    lr: float = 1.5e-3
    warmup: int = 60
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    # One thread: on this 2-core machine shared with other jobs, a vision step took 0.7 s with
    # one torch thread and 3.7 s with two (the two threads wait on each other).
    threads: int = 1
    still_share: float = 0.3  # samples that are a still image (split=True); the rest are windows
    max_frames: int = 8
    # A window has n frames with probability proportional to n ** -frame_decay: shapes are
    # learnt per frame, so short windows teach as much for less vision compute.
    frame_decay: float = 2.0
    cut_share: float = 0.15  # windows that straddle a cut between two scenes (see SampleMaker._cut)
    # Canvas sizes (width, height) a sample is rendered at; the preprocessor squashes each to 64 x 64.
    canvases: tuple[tuple[int, int], ...] = ((128, 96), (96, 96), (160, 120), (64, 64), (96, 72), (112, 84))
    # The other samples are drawn at demo_scenes.random_canvas: any aspect ratio from portrait to
    # wider than 16:9, which the preprocessor squashes to 64 x 64 (shapes arrive stretched).
    free_canvas_share: float = 0.5
    vision_hidden: int = 128
    vision_layers: int = 3
    vision_heads: int = 4
    text_hidden: int = 128
    text_layers: int = 3
    text_heads: int = 4
    text_kv_heads: int = 2
    max_positions: int = 1024


TILE = 64
PATCH = 8
SCALE_FACTOR = 2


def image_seq_len() -> int:
    return (TILE // PATCH) ** 2 // SCALE_FACTOR**2


# --- the folder's small files ------------------------------------------------------------------


def corpus() -> list[str]:
    """The text the tokenizer learns merges from: the chat framing, the prompts, every caption."""
    from ffai.engines.smolvlm.engine import FRAMES_PROMPT, STILL_PROMPT

    # The pieces between special tokens in a rendered prompt (see prompt.PromptBuilder).
    framing = ["User:", STILL_PROMPT, FRAMES_PROMPT, "\nAssistant:"]
    return framing * 20 + [" " + c for c in demo_scenes.all_captions()] * 4


def train_tokenizer():
    """Byte-level BPE with SmolVLM's pre-tokenizer (digits split, ByteLevel without prefix space),
    every byte in the alphabet so any --prompt can be encoded, and the special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        special_tokens=[*BASE_SPECIALS, *IMAGE_SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    return tok


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_small_files(folder: Path, tok) -> dict[str, int]:
    """Tokenizer, chat template, processor and generation settings; returns the special ids."""
    ids = {t: tok.token_to_id(t) for t in (*BASE_SPECIALS, "<image>", "<end_of_utterance>")}
    tok.save(str(folder / "tokenizer.json"))
    shutil.copyfile(REFERENCE_DIR / "chat_template.json", folder / "chat_template.json")
    template = json.loads((REFERENCE_DIR / "chat_template.json").read_text(encoding="utf-8"))["chat_template"]
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|im_start|>",
            "eos_token": "<end_of_utterance>",
            "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>",
            "model_max_length": Recipe.max_positions,
            "clean_up_tokenization_spaces": False,
            "processor_class": "Idefics3Processor",
            "chat_template": template,
        },
    )
    pre = json.loads((REFERENCE_DIR / "preprocessor_config.json").read_text(encoding="utf-8"))
    # longest_edge == tile: every image becomes one 64 x 64 frame, split or not.
    pre["size"] = {"longest_edge": TILE}
    pre["max_image_size"] = {"longest_edge": TILE}
    write_json(folder / "preprocessor_config.json", pre)
    write_json(
        folder / "processor_config.json", {"image_seq_len": image_seq_len(), "processor_class": "Idefics3Processor"}
    )
    return ids


def write_generation_config(folder: Path, ids: dict[str, int]) -> None:
    """As the real checkpoint: stop on <end_of_utterance>; written after save_pretrained, which
    would otherwise leave its own copy without the stop id."""
    import transformers

    write_json(
        folder / "generation_config.json",
        {
            "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": ids["<end_of_utterance>"],
            "pad_token_id": ids["<|im_end|>"],
            "transformers_version": transformers.__version__,
        },
    )


def model_config(recipe: Recipe, vocab_size: int, ids: dict[str, int]):
    from transformers import Idefics3Config

    text_head_dim = recipe.text_hidden // recipe.text_heads
    return Idefics3Config(
        image_token_id=ids["<image>"],
        scale_factor=SCALE_FACTOR,
        vocab_size=vocab_size,
        pad_token_id=ids["<|im_end|>"],
        tie_word_embeddings=False,
        vision_config=dict(
            hidden_size=recipe.vision_hidden,
            intermediate_size=4 * recipe.vision_hidden,
            num_hidden_layers=recipe.vision_layers,
            num_attention_heads=recipe.vision_heads,
            patch_size=PATCH,
            image_size=TILE,
            layer_norm_eps=1e-6,
            hidden_act="gelu_pytorch_tanh",
        ),
        text_config=dict(
            model_type="llama",
            vocab_size=vocab_size,
            hidden_size=recipe.text_hidden,
            intermediate_size=3 * recipe.text_hidden,
            num_hidden_layers=recipe.text_layers,
            num_attention_heads=recipe.text_heads,
            num_key_value_heads=recipe.text_kv_heads,
            head_dim=text_head_dim,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=recipe.max_positions,
            bos_token_id=ids["<|im_start|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|im_end|>"],
            tie_word_embeddings=False,
        ),
    )


# --- samples -----------------------------------------------------------------------------------


@dataclass
class Sample:
    input_ids: list[int]
    labels: list[int]  # -100 on the prompt
    pixel_values: object  # (n_images, 3, 64, 64) float32 tensor
    image_labels: object  # (n_images, 3) long: shape, colour, background indices (LabelHead)


class SampleMaker:
    """Samples built with the engine's own preprocess and prompt code on the folder being written."""

    def __init__(self, folder: Path, recipe: Recipe, rng: random.Random) -> None:
        from tokenizers import Tokenizer

        from ffai.engines.smolvlm.preprocess import ProcessorConfig
        from ffai.engines.smolvlm.prompt import PromptBuilder

        self.recipe = recipe
        self.rng = rng
        self.processor = ProcessorConfig.from_dir(folder)
        self.prompts = PromptBuilder.from_dir(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.end_id = self.prompts.end_of_utterance_id
        self.frame_weights = [n**-recipe.frame_decay for n in range(1, recipe.max_frames + 1)]

    def answer_ids(self, caption: str) -> list[int]:
        # The leading space is what follows "Assistant:" in SmolVLM's own answers.
        return self.tokenizer.encode(" " + caption, add_special_tokens=False).ids + [self.end_id]

    def canvas(self) -> tuple[int, int]:
        if self.rng.random() < self.recipe.free_canvas_share:
            return demo_scenes.random_canvas(self.rng)
        return self.rng.choice(self.recipe.canvases)

    def sample(self) -> Sample:
        import torch

        from ffai.engines.contract import DecodingOptions
        from ffai.engines.smolvlm.engine import prompt_text
        from ffai.engines.smolvlm.preprocess import normalise, preprocess_images

        r = self.recipe
        canvas = self.canvas()
        split = self.rng.random() < r.still_share
        if not split and self.rng.random() < r.cut_share:
            scenes, scene = self._cut(self.rng.randint(2, r.max_frames), canvas)
        else:
            scene = demo_scenes.sample_scene(self.rng, "train")
            n = 1 if split else self.rng.choices(range(1, r.max_frames + 1), self.frame_weights)[0]
            scenes = [(scene, image) for image in demo_scenes.render(scene, n, canvas)]
        images = [image for _, image in scenes]
        batch = preprocess_images(images, self.processor, split=split)
        text = prompt_text(DecodingOptions(), len(images), split)
        prompt = self.prompts.build(batch.grids, text, self.processor.image_seq_len)
        answer = self.answer_ids(demo_scenes.caption(scene))
        labels = torch.cat([scene_labels(s) for s, _ in scenes])  # each frame's own scene
        pixel_values = normalise(batch.tiles, self.processor)
        return Sample(prompt + answer, [-100] * len(prompt) + answer, pixel_values, labels)

    def _cut(self, n: int, canvas: tuple[int, int]):
        """A window across a scene cut: k frames of one scene, then n - k of another. Its caption
        is the scene with more frames, the first on a tie, so that a window straddling two
        scenes of a video gets one of their captions rather than a blend of both."""
        first, second = demo_scenes.sample_scene(self.rng, "train"), demo_scenes.sample_scene(self.rng, "train")
        k = self.rng.randint(1, n - 1)
        frames = [(first, im) for im in demo_scenes.render(first, n, canvas)[:k]]
        frames += [(second, im) for im in demo_scenes.render(second, n, canvas)[k:]]
        return frames, first if k >= n - k else second

    def frames(self, n: int):
        """``n`` single frames of ``n`` scenes for phase 1: (n, 3, 64, 64) pixels, (n, 3) labels."""
        import torch

        from ffai.engines.smolvlm.preprocess import normalise, preprocess_images

        scenes = [demo_scenes.sample_scene(self.rng, "train") for _ in range(n)]
        images = [demo_scenes.render(s, 1, self.canvas())[0] for s in scenes]
        pixels = normalise(preprocess_images(images, self.processor, split=False).tiles, self.processor)
        return pixels, torch.cat([scene_labels(s) for s in scenes])


def scene_labels(scene: demo_scenes.Scene):
    import torch

    return torch.tensor(
        [
            [
                demo_scenes.SHAPES.index(scene.shape),
                list(demo_scenes.COLOURS).index(scene.colour),
                list(demo_scenes.BACKGROUNDS).index(scene.background),
            ]
        ]
    )


def collate(samples: list[Sample], pad_id: int) -> dict:
    """Right-padded ids, labels and mask; pixel values padded with all-zero images, which
    transformers drops (a real normalised image is never all 0.0: that would be grey 127.5)."""
    import torch

    width = max(len(s.input_ids) for s in samples)
    n_images = max(s.pixel_values.shape[0] for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(samples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    pixels = torch.zeros((len(samples), n_images, 3, TILE, TILE))  # (B, n_images, C, H, W)
    for i, s in enumerate(samples):
        t = len(s.input_ids)
        ids[i, :t] = torch.tensor(s.input_ids)
        labels[i, :t] = torch.tensor(s.labels)
        mask[i, :t] = 1
        pixels[i, : s.pixel_values.shape[0]] = s.pixel_values
    image_labels = torch.cat([s.image_labels for s in samples])  # (real images, 3), in batch order
    return {"input_ids": ids, "labels": labels, "attention_mask": mask, "pixel_values": pixels}, image_labels


# --- training ----------------------------------------------------------------------------------


def lr_at(step: int, steps: int, recipe: Recipe) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak over ``steps``."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# Where the words a viewer must read off the image sit in "a red circle on a blue background".
ANSWER_SLOTS = {"colour": 1, "shape": 2, "background": 5}


def slot_accuracy(logits, labels) -> dict[str, float]:
    """Teacher-forced accuracy on each answer slot, from the batch's own logits."""
    import torch

    pred = logits[:, :-1].argmax(-1)  # (B, T-1): the prediction for token t+1
    target = labels[:, 1:]
    first = (target != -100).int().argmax(dim=1)  # (B,) offset of each row's answer
    rows = torch.arange(target.shape[0])
    return {
        name: float((pred[rows, first + k] == target[rows, first + k]).float().mean())
        for name, k in ANSWER_SLOTS.items()
    }


class LabelHead:
    """Training-only classifier on the vision tower's output (never saved).

    The caption loss reaches the vision tower through one shape token and a text tower that
    starts random; on its own it leaves the shape word at chance for many hundreds of steps on
    this CPU budget. A direct shape/colour/background loss on the tower's features teaches it
    in a few hundred cheap vision-only steps (phase 1).

    Each patch votes with its own logits and the image takes the strongest vote per class (max
    over patches): a shape is told by a few patches (a corner, a point of a star), which a mean
    over all patches drowns in background; measured on this task, shape accuracy after 350
    steps was 0.82 with the max against 0.40 with the mean.
    """

    def __init__(self, hidden: int) -> None:
        import torch

        self.sizes = (len(demo_scenes.SHAPES), len(demo_scenes.COLOURS), len(demo_scenes.BACKGROUNDS))
        self.linear = torch.nn.Linear(hidden, sum(self.sizes))

    def loss(self, features, labels):
        """(N, patches, D) vision output, (N, 3) labels -> summed cross-entropy, shape accuracy."""
        import torch.nn.functional as F

        logits = self.linear(features).amax(dim=1).split(self.sizes, dim=-1)
        loss = sum(F.cross_entropy(lg, labels[:, k]) for k, lg in enumerate(logits))
        shape_acc = float((logits[0].argmax(-1) == labels[:, 0]).float().mean())
        return loss, shape_acc


def adamw(params, recipe: Recipe):
    import torch

    params = list(params)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, 0.98))


def step_optimizer(optim, loss, params, step: int, steps: int, recipe: Recipe) -> None:
    import torch

    for group in optim.param_groups:
        group["lr"] = lr_at(step, steps, recipe)
    optim.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
    optim.step()


def pretrain_vision(model, head: LabelHead, maker: SampleMaker, recipe: Recipe, log) -> list:
    """Phase 1: vision tower + label head on single frames."""
    vision = model.model.vision_model
    params = [*vision.parameters(), *head.linear.parameters()]
    optim = adamw(params, recipe)
    history, accs, started = [], [], time.perf_counter()
    for step in range(recipe.vision_steps):
        pixels, labels = maker.frames(recipe.vision_batch)
        loss, acc = head.loss(vision(pixel_values=pixels).last_hidden_state, labels)
        step_optimizer(optim, loss, params, step, recipe.vision_steps, recipe)
        accs.append(acc)
        if (step + 1) % 50 == 0:
            recent = sum(accs[-50:]) / 50
            history.append((step + 1, loss.item(), recent))
            log(
                f"vision step {step + 1:4d}  label loss {loss.item():.4f}  shape acc (last 50) {recent:.2f}  {time.perf_counter() - started:.0f} s"
            )
    return history


def train_captions(model, maker: SampleMaker, recipe: Recipe, pad_id: int, log) -> list:
    """Phase 2: connector and text tower on captions (loss on the answer), the vision tower
    frozen as phase 1 left it: no backward pass through it, so a step costs about half."""
    model.model.vision_model.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = adamw(params, recipe)
    history, started = [], time.perf_counter()
    for step in range(recipe.steps):
        batch, _ = collate([maker.sample() for _ in range(recipe.batch)], pad_id)
        out = model(**batch)
        step_optimizer(optim, out.loss, params, step, recipe.steps, recipe)
        if step % 25 == 0 or step == recipe.steps - 1:
            loss, acc = out.loss.item(), slot_accuracy(out.logits.detach(), batch["labels"])
            history.append((step, loss, acc))
            slots = "  ".join(f"{k} {v:.2f}" for k, v in acc.items())
            log(f"caption step {step:4d}  loss {loss:.4f}  {slots}  {time.perf_counter() - started:.0f} s")
    model.model.vision_model.requires_grad_(True)
    return history


def train(folder: Path, recipe: Recipe, vocab_size: int, ids: dict[str, int], log=print):
    """Both phases on a fresh model; returns the model and the two phases' logs."""
    import torch
    from transformers import Idefics3ForConditionalGeneration

    torch.manual_seed(recipe.seed)
    torch.set_num_threads(recipe.threads)
    model = Idefics3ForConditionalGeneration(model_config(recipe, vocab_size, ids)).float().train()
    head = LabelHead(recipe.vision_hidden)
    maker = SampleMaker(folder, recipe, random.Random(recipe.seed))
    vision_history = pretrain_vision(model, head, maker, recipe, log)
    caption_history = train_captions(model, maker, recipe, ids["<|im_end|>"], log)
    return model.eval(), (vision_history, caption_history)


# --- release -----------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, manifest: Path) -> None:
    lines = [
        "# The bundled demo checkpoint: a tiny Idefics3 trained on synthetic shapes by",
        "# scripts/train_demo_model.py (see RECIPE.md in the folder). Not on the hub.",
        f'name = "{MANIFEST_NAME}"',
        'engine = "smolvlm"',
        'hf_repo = ""',
        'revision = ""',
        'license = "Apache-2.0"',
        'description = "Demo: a tiny Idefics3 that captions synthetic coloured shapes (\\"a red circle on a blue background\\")"',
    ]
    for path in sorted(folder.iterdir()):
        if path.name == DOC_FILE:
            continue
        lines += [
            "",
            "[[files]]",
            f'path = "{path.name}"',
            f"size = {path.stat().st_size}",
            f'sha256 = "{sha256(path)}"',
        ]
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_recipe(
    folder: Path, recipe: Recipe, vocab_size: int, history, wall_s: float, result: demo_eval.Result | None
) -> None:
    import torch
    import transformers

    r = asdict(recipe)
    vision_history, caption_history = history
    vision_rows = "\n".join(f"| {s} | {loss:.4f} | {acc:.2f} |" for s, loss, acc in vision_history)
    caption_rows = "\n".join(
        f"| {s} | {loss:.4f} | " + " | ".join(f"{acc[k]:.2f}" for k in ANSWER_SLOTS) + " |"
        for s, loss, acc in caption_history
    )
    acc_line = "not measured (--eval-n 0)"
    if result is not None:
        acc_line = f"{result.correct}/{result.total} = {100 * result.accuracy:.1f} % exact captions; " + ", ".join(
            f"{group} {c}/{t} = {100 * c / t:.1f} %"
            for group in demo_eval.GROUPS
            for c, t in [result.by_group.get(group, (0, 0))]
            if t
        )
    palettes = "\n".join(
        f"  - {polarity}: shapes {', '.join(demo_scenes.SHAPE_COLOURS[polarity])} on backgrounds "
        f"{', '.join(demo_scenes.BACKGROUND_COLOURS[polarity])}"
        for polarity in demo_scenes.POLARITIES
    )
    text = f"""# smolvlm-demo: how it was made

A tiny Idefics3 (SmolVLM architecture) trained from scratch on synthetic scenes, so that
`ffai caption` runs offline out of the box. It knows one thing: captions such as
"a red circle on a blue background" for one shape on a plain background. Anything else gets a
caption of that form too.

Rebuild: `python scripts/train_demo_model.py --seed {recipe.seed}` (the defaults are the recipe below)
Evaluate: `python scripts/eval_demo_model.py`

## Data (ffai/bench/demo_scenes.py)

- shapes {", ".join(demo_scenes.SHAPES)}; two polarities, half the scenes each:
{palettes}
  (never the shape's colour name): {len(demo_scenes.all_captions())} captions
- radius {demo_scenes.RADIUS[0]}-{demo_scenes.RADIUS[1]} of the short side, centre within
  [{demo_scenes.EDGE}, {1 - demo_scenes.EDGE}], {int(100 * demo_scenes.MOVING_SHARE)} % moving in one of
  {demo_scenes.DIRECTIONS} directions over {demo_scenes.TRAVEL[0]}-{demo_scenes.TRAVEL[1]} of the frame
- held out: one geometry cell (size x start position x motion) in {demo_scenes.HELDOUT_ONE_IN}, never trained on
- samples: {int(100 * recipe.still_share)} % stills (split=True, "Describe this image."), the rest windows of
  1-{recipe.max_frames} frames of one scene (split=False), n frames with weight n^-{recipe.frame_decay};
  {int(100 * recipe.cut_share)} % of windows straddle a cut between two scenes and take the caption of the scene
  with more frames (the first on a tie); canvases: {int(100 * (1 - recipe.free_canvas_share))} % one of
  {", ".join(f"{w}x{h}" for w, h in recipe.canvases)}, the rest width/height log-uniform over
  {demo_scenes.ASPECT[0]}-{demo_scenes.ASPECT[1]} with the long side {demo_scenes.LONG_SIDE[0]}-{demo_scenes.LONG_SIDE[1]} px
- inputs built by the engine's preprocess_images + PromptBuilder; caption loss on the answer and `<end_of_utterance>` only

## Model

- vision: {TILE} px images, {PATCH} px patches, hidden {recipe.vision_hidden}, {recipe.vision_layers} layers,
  {recipe.vision_heads} heads; pixel shuffle x{SCALE_FACTOR} -> {image_seq_len()} image tokens per image
- text: llama, hidden {recipe.text_hidden}, {recipe.text_layers} layers, {recipe.text_heads} heads /
  {recipe.text_kv_heads} kv heads, context {recipe.max_positions}
- tokenizer: byte-level BPE trained on the prompts and captions, {vocab_size} tokens, SmolVLM's
  special tokens and chat template; preprocessor size.longest_edge = max_image_size = {TILE},
  so a still is one {TILE} x {TILE} image like a video frame
- weights float32, saved by transformers {transformers.__version__} `save_pretrained`

## Training

- phase 1, {recipe.vision_steps} steps: the vision tower alone on batches of {recipe.vision_batch} single frames, with a
  training-only linear head on each patch, max-pooled over the patches, predicting shape, colour
  and background
  (the caption loss alone leaves the shape word at chance for hundreds of steps)
- phase 2, {recipe.steps} steps: connector and text tower on batches of {recipe.batch} captioned samples,
  caption loss only, the vision tower frozen; the head is discarded
- each phase: AdamW (betas 0.9, 0.98), lr {recipe.lr}, {recipe.warmup} warmup steps, cosine to 10 % of the peak
- recipe: `{json.dumps(r)}`
- torch {torch.__version__}, {recipe.threads} CPU threads, wall time {wall_s / 60:.1f} min (both phases; the CPU was shared)
- held-out accuracy at release (engine, greedy, `scripts/eval_demo_model.py`): {acc_line}

Phase 1, label-head loss and shape accuracy over the last 50 batches:

| step | loss | shape |
|---|---|---|
{vision_rows}

Phase 2, caption loss and teacher-forced accuracy of the words read off the image (logged batch):

| step | loss | colour | shape | background |
|---|---|---|---|---|
{caption_rows}
"""
    (folder / DOC_FILE).write_text(text, encoding="utf-8")


def _publishable(folder: Path) -> None:
    """mkdtemp and the safetensors writer make owner-only entries; a shipped folder is world-readable."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def build(out: Path, recipe: Recipe, *, eval_n: int = demo_eval.DEFAULT_N, manifest: Path | None = None) -> Path:
    """Train and write the checkpoint folder ``out``: into a temporary folder beside it, moved
    into place once complete, so an interrupted run leaves the old folder as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tok = train_tokenizer()
        ids = write_small_files(staging, tok)
        model, history = train(staging, recipe, tok.get_vocab_size(), ids)
        model.save_pretrained(staging, safe_serialization=True)
        write_generation_config(staging, ids)
        wall_s = time.perf_counter() - started
        result = None
        if eval_n:
            result = demo_eval.evaluate(staging, n=eval_n, seed=demo_eval.DEFAULT_SEED)
            print(f"held-out accuracy {result.correct}/{result.total} {result.by_group}")
        write_recipe(staging, recipe, tok.get_vocab_size(), history, wall_s, result)
        _publishable(staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if manifest is not None:
        write_manifest(out, manifest)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--vision-steps", type=int, default=Recipe.vision_steps)
    parser.add_argument("--steps", type=int, default=Recipe.steps, help="caption (phase 2) steps")
    parser.add_argument("--seed", type=int, default=Recipe.seed)
    parser.add_argument("--batch", type=int, default=Recipe.batch)
    parser.add_argument("--lr", type=float, default=Recipe.lr)
    parser.add_argument(
        "--eval-n", type=int, default=demo_eval.DEFAULT_N, help="held-out scenes to evaluate at the end (0: none)"
    )
    parser.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help=f"write the manifest here (default: models/{MANIFEST_NAME}.toml when --out is the default)",
    )
    args = parser.parse_args(argv)
    recipe = Recipe(seed=args.seed, vision_steps=args.vision_steps, steps=args.steps, batch=args.batch, lr=args.lr)
    manifest = args.manifest
    if manifest is None and args.out.resolve() == DEFAULT_OUT:
        manifest = REPO / "ffai" / "models" / "bundled" / f"{MANIFEST_NAME}.toml"
    print(build(args.out, recipe, eval_n=args.eval_n, manifest=manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
