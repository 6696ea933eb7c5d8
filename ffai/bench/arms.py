"""The two arms of `ffai bench vlm`, each meant to run alone in a fresh process.

    python -m ffai.bench.arms ARM CASE --model DIR [--dtype D] [--clip MP4] [--corpus DIR]

prints one JSON object on stdout. In that process: load the model (untimed), answer the case's
first item once (warm-up, untimed), then run the whole case once, timed. The parent measures the
process tree's peak RSS, so each arm's footprint is its own.

- ``ffai``: the engine through the pipeline, placed and threaded as ``ffai caption`` places a
  video's stages (a ``Captioner``; its ``answers`` and its cues carry the token ids). The
  ``clip`` case is the whole caption path: probe, decode, sample, window, pipeline, cues in
  order. This arm never imports transformers, and reports whether anything did.
- ``reference``: transformers' Idefics3ForConditionalGeneration (float32, always) with its PIL
  processor, asked the same question ffai asks; ``clip`` decodes the same windows with
  ``ffai.media.sample_frames`` and calls processor + generate per window.

CASE ``quality`` answers the quality corpus instead (``--corpus DIR``, or the demo model's
held-out scenes when no corpus is given) and reports the answers and how many were right.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ffai.bench import cases
from ffai.bench.cases import Item, QualityItem
from ffai.captioning import Captioner, CaptionOptions, available_cores
from ffai.engine import DTYPES, DecodingOptions, RuntimeOptions
from ffai.errors import FfaiError, ModelError

ARMS = ("ffai", "reference")
QUALITY = "quality"  # the case name of the quality run


class FfaiArm:
    name = "ffai"

    def __init__(self, model_dir: Path, dtype: str, cores: int) -> None:
        # Placement and threads as `ffai caption` chooses them for a video run on these cores;
        # the pipeline sets the thread counts, as it does for `ffai caption`.
        runtime = RuntimeOptions(dtype=dtype, device="cpu")
        options = CaptionOptions(
            model=str(model_dir),
            fps=cases.CLIP_FPS,
            window=cases.CLIP_WINDOW,
            decoding=cases.decoding(),
            runtime=runtime,
        )
        self.captioner = Captioner(options, video=True, cores=cores)

    def load(self) -> None:
        self.captioner.start()  # its stages load the weights before they report ready

    def answer(self, item: Item | QualityItem, options: DecodingOptions) -> tuple[list[int], str]:
        [(_, answer)] = self.captioner.answers([(item.id, item.request(options))])
        return list(answer.token_ids), answer.text

    def answer_all(self, items: list, options: list[DecodingOptions]) -> dict[str, tuple[list[int], str]]:
        """Many requests in flight at once, as the caption path keeps its pipeline busy."""
        requests = ((it.id, it.request(o)) for it, o in zip(items, options))
        return {request_id: (list(a.token_ids), a.text) for request_id, a in self.captioner.answers(requests)}

    def clip(self, path: Path) -> dict[str, list[int]]:
        from ffai import media

        # Keyed as the reference arm keys its windows (cases.clip_items): 0-based window index.
        return {str(cue.index - 1): list(cue.token_ids) for cue in self.captioner.captions(media.probe(path))}

    def info(self) -> dict:
        return {
            "torch_threads": {p.name: p.threads for p in self.captioner.config.processes},
            # ffai's own process must stay free of transformers (checked after the run).
            "transformers_imported": "transformers" in sys.modules,
        }

    def close(self) -> None:
        self.captioner.close()


class ReferenceArm:
    name = "reference"

    def __init__(self, model_dir: Path, dtype: str, cores: int) -> None:
        self.model_dir = model_dir  # the reference is the float32 baseline whatever --dtype says
        self.cores = cores
        self.model = self.processor = None

    def load(self) -> None:
        try:
            import torch
            from transformers import AutoProcessor, Idefics3ForConditionalGeneration
        except ImportError as e:
            raise ModelError(cases.MISSING_REFERENCE) from e
        # The same cores ffai plans its placement and threads for, all given to the one process.
        torch.set_num_threads(self.cores)
        self.model = Idefics3ForConditionalGeneration.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self.processor = AutoProcessor.from_pretrained(self.model_dir, backend="pil")
        eos = self.model.generation_config.eos_token_id
        self.stop_ids = set(eos if isinstance(eos, list) else [eos])

    def answer(self, item: Item | QualityItem, options: DecodingOptions) -> tuple[list[int], str]:
        import torch

        from ffai_smolvlm.engine import prompt_text

        n = len(item.images)
        content = [{"type": "image"}] * n + [{"type": "text", "text": prompt_text(options, n, still=item.still)}]
        chat = self.processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        inputs = self.processor(text=chat, images=list(item.images), return_tensors="pt", do_image_splitting=item.still)
        budget = {"max_new_tokens": options.max_new_tokens, "do_sample": False}
        if options.force_new_tokens:
            budget["min_new_tokens"] = options.max_new_tokens
        with torch.inference_mode():
            out = self.model.generate(**inputs, **budget)
        tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
        # transformers keeps the stop token that ended the answer; ffai leaves it out.
        if tokens and tokens[-1] in self.stop_ids and not options.force_new_tokens:
            tokens = tokens[:-1]
        return tokens, self.processor.decode(tokens, skip_special_tokens=True)

    def answer_all(self, items: list, options: list[DecodingOptions]) -> dict[str, tuple[list[int], str]]:
        return {it.id: self.answer(it, o) for it, o in zip(items, options)}

    def clip(self, path: Path) -> dict[str, list[int]]:
        options = cases.decoding()
        return {item.id: self.answer(item, options)[0] for item in cases.clip_items(path)}

    def info(self) -> dict:
        import torch

        return {
            "torch_threads": {"main": torch.get_num_threads()},
            "image_processor": type(self.processor.image_processor).__name__,
        }

    def close(self) -> None:
        self.model = self.processor = None


ARM_TYPES = {"ffai": FfaiArm, "reference": ReferenceArm}


def run_case(arm, case: str, clip: Path | None) -> dict:
    """Warm-up on the case's first item (untimed), then the whole case once, timed."""
    options = cases.decoding()
    first = next(iter(cases.clip_items(clip))) if case == "clip" else cases.items(case)[0]
    start = time.perf_counter()
    arm.answer(first, options)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    if case == "clip":
        tokens = arm.clip(clip)
    else:
        tokens = {item.id: arm.answer(item, options)[0] for item in cases.items(case)}
    return {"time_s": time.perf_counter() - start, "warmup_s": warmup_s, "tokens": tokens}


def run_quality(arm, corpus: Path | None, n: int) -> dict:
    items = cases.corpus_items(corpus) if corpus else cases.demo_items(n)
    options = [DecodingOptions(prompt=it.prompt, max_new_tokens=it.max_new_tokens) for it in items]
    start = time.perf_counter()
    answers = arm.answer_all(items, options)
    texts = {it.id: answers[it.id][1].strip() for it in items}
    correct = sum(texts[it.id] == it.answer.strip() for it in items)
    return {"time_s": time.perf_counter() - start, "correct": correct, "total": len(items), "answers": texts}


def run(
    arm_name: str,
    case: str,
    model_dir: Path,
    *,
    dtype: str = "float32",
    cores: int | None = None,
    clip: Path | None = None,
    corpus: Path | None = None,
    quality_n: int = cases.DEMO_N,
) -> dict:
    """One arm on one case in this process; the result the parent reads as JSON."""
    arm = ARM_TYPES[arm_name](model_dir, dtype, cores or available_cores())
    start = time.perf_counter()
    try:
        arm.load()
        load_s = time.perf_counter() - start
        result = run_quality(arm, corpus, quality_n) if case == QUALITY else run_case(arm, case, clip)
        info = arm.info()
    finally:
        arm.close()
    return {
        "arm": arm_name,
        "case": case,
        "dtype": dtype if arm_name == "ffai" else "float32",
        "load_s": load_s,
        **result,
        **info,
    }


def command(
    arm: str,
    case: str,
    model_dir: Path,
    *,
    dtype: str,
    cores: int,
    clip: Path | None = None,
    corpus: Path | None = None,
    quality_n: int = cases.DEMO_N,
) -> list[str]:
    """The command line that runs ``run(...)`` in a fresh Python process."""
    cmd = [
        sys.executable,
        "-m",
        "ffai.bench.arms",
        arm,
        case,
        "--model",
        str(model_dir),
        "--dtype",
        dtype,
        "--cores",
        str(cores),
        "--quality-n",
        str(quality_n),
    ]
    if clip is not None:
        cmd += ["--clip", str(clip)]
    if corpus is not None:
        cmd += ["--corpus", str(corpus)]
    return cmd


def print_result(compute) -> int:
    """A bench child's protocol: the JSON object ``compute()`` returns on stdout, exit 0; or an
    FfaiError as one ``ffai: error: …`` line on stderr and its exit code."""
    try:
        result = compute()
    except FfaiError as e:
        print(f"ffai: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return e.exit_code
    print(json.dumps(result, ensure_ascii=False), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ffai.bench.arms", description=__doc__.splitlines()[0])
    parser.add_argument("arm", choices=ARMS)
    parser.add_argument("case", choices=(*cases.CASES, QUALITY))
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--cores", type=int, help="cores both arms may use (default: this process's)")
    parser.add_argument("--clip", type=Path)
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--quality-n", type=int, default=cases.DEMO_N)
    args = parser.parse_args(argv)
    return print_result(
        lambda: run(
            args.arm,
            args.case,
            args.model,
            dtype=args.dtype,
            cores=args.cores,
            clip=args.clip,
            corpus=args.corpus,
            quality_n=args.quality_n,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
