"""The two arms of `ffai bench vlm`, each meant to run alone in a fresh process.

    python -m ffai.bench.arms ARM CASE --model DIR [--engine NAME] [--dtype D] [--clip MP4] [--corpus DIR]

prints one JSON object on stdout. In that process: load the model (untimed), answer the case's
first item once (warm-up, untimed), then run the whole case once, timed. The parent measures the
process tree's peak RSS, so each arm's footprint is its own.

- ``ffai``: the engine through the pipeline, placed and threaded as ``ffai caption`` places a
  video's stages (a ``Captioner``; its ``answers`` and its cues carry the token ids). The
  ``clip`` case is the whole caption path: probe, decode, sample, window, pipeline, cues in
  order. This arm never imports transformers, and reports whether anything did.
- ``reference``: the engine's reference arm, from its bench hooks (``ffai.bench.hooks``): an
  implementation of its own (float32, always), asked the same question ffai asks; ``clip``
  answers the same windows (``cases.clip_items``) one at a time, as transformers' docs caption a
  video. SmolVLM's is transformers' Idefics3 (``ffai.engines.smolvlm.bench.reference``).
- ``reference-batched``: the same reference on the ``clip`` case only, ``--batch`` windows at a
  time, padded into one batch (its ``clip_batched``), so ffai's batched text stage also faces
  the reference batched.

CASE ``quality`` answers the quality corpus instead (``--corpus DIR``, or the demo model's
held-out scenes when no corpus is given) and reports the answers and how many were right.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ffai.bench import cases, gates
from ffai.bench.cases import Item, QualityItem
from ffai.engines.contract import DTYPES, DecodingOptions, RuntimeOptions
from ffai.errors import FfaiError
from ffai.kit import host
from ffai.run.captioner import Captioner, available_cores
from ffai.run.options import CaptionOptions

BATCHED = gates.BATCHED
ARMS = (*gates.ARMS, BATCHED)
QUALITY = "quality"  # the case name of the quality run
LOAD = "load"  # the case name of a load alone (untimed: fills the machine's caches of compiled parts)


class FfaiArm:
    name = "ffai"

    def __init__(
        self,
        model_dir: Path,
        dtype: str,
        cores: int,
        engine: str | None = None,
        compile: bool = False,
        batch: int = 1,
    ) -> None:
        # Placement and threads as `ffai caption` chooses them for a video run on these cores;
        # the pipeline sets the thread counts, as it does for `ffai caption`.
        runtime = RuntimeOptions(dtype=dtype, device="cpu", compile=compile, batch=batch)
        options = CaptionOptions(
            engine=engine,
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
        # Keyed as the reference arm keys its windows (cases.clip_items): 0-based window index.
        info = self.captioner.decoder.probe(path)
        return {str(cue.index - 1): list(cue.token_ids) for cue in self.captioner.captions(info)}

    def info(self) -> dict:
        return {
            "torch_threads": {p.name: p.threads for p in self.captioner.config.processes},
            # ffai's own process must stay free of transformers (checked after the run).
            "transformers_imported": "transformers" in sys.modules,
        }

    def close(self) -> None:
        self.captioner.close()


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


def make_arm(
    arm_name: str,
    model_dir: Path,
    dtype: str,
    cores: int,
    engine: str | None = None,
    compile: bool = False,
    batch: int = 1,
):
    """The arm called ``arm_name``: ffai's, or the reference the engine's bench hooks give
    (batched: its ``clip`` answers ``batch`` windows at a time)."""
    if arm_name == "ffai":
        return FfaiArm(model_dir, dtype, cores, engine, compile, batch)
    from ffai.bench.hooks import hooks_for

    reference = hooks_for(engine).reference(model_dir, cores)
    return BatchedReference(reference, batch) if arm_name == BATCHED else reference


class BatchedReference:
    """A reference arm whose ``clip`` decodes ``batch`` windows at a time (``clip_batched``)."""

    name = BATCHED

    def __init__(self, reference, batch: int) -> None:
        if not hasattr(reference, "clip_batched"):
            raise FfaiError(f"this engine's reference arm cannot batch windows ({type(reference).__name__})")
        self.reference, self.batch = reference, batch

    def __getattr__(self, name: str):
        return getattr(self.reference, name)

    def clip(self, path: Path) -> dict[str, list[int]]:
        return self.reference.clip_batched(path, self.batch)


def run(
    arm_name: str,
    case: str,
    model_dir: Path,
    *,
    engine: str | None = None,
    dtype: str = "float32",
    cores: int | None = None,
    clip: Path | None = None,
    corpus: Path | None = None,
    quality_n: int = cases.DEMO_N,
    compile: bool = False,
    batch: int = 1,
) -> dict:
    """One arm on one case in this process; the result the parent reads as JSON. The case
    ``LOAD`` only loads: what a first load builds for this machine (``--compile``) is built then."""
    arm = make_arm(arm_name, model_dir, dtype, cores or available_cores(), engine, compile, batch)
    start = time.perf_counter()
    try:
        arm.load()
        load_s = time.perf_counter() - start
        if case == LOAD:
            result = {}
        elif case == QUALITY:
            result = run_quality(arm, corpus, quality_n)
        else:
            result = run_case(arm, case, clip)
        info = arm.info()
    finally:
        arm.close()
    return {
        "arm": arm_name,
        "case": case,
        "dtype": dtype if arm_name == "ffai" else "float32",
        "batch": batch if arm_name != "reference" else 1,
        "load_s": load_s,
        **result,
        **info,
    }


def command(
    arm: str,
    case: str,
    model_dir: Path,
    *,
    engine: str | None = None,
    dtype: str,
    cores: int,
    clip: Path | None = None,
    corpus: Path | None = None,
    quality_n: int = cases.DEMO_N,
    compile: bool = False,
    batch: int = 1,
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
        "--batch",
        str(batch),
    ]
    if engine is not None:
        cmd += ["--engine", engine]
    if clip is not None:
        cmd += ["--clip", str(clip)]
    if corpus is not None:
        cmd += ["--corpus", str(corpus)]
    if compile:
        cmd.append("--compile")
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
    parser.add_argument("case", choices=(*cases.CASES, QUALITY, LOAD))
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--engine", help="the engine (default: the default engine)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--cores", type=int, help="cores both arms may use (default: this process's)")
    parser.add_argument("--clip", type=Path)
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--quality-n", type=int, default=cases.DEMO_N)
    parser.add_argument("--compile", action="store_true", help="ffai's opt-in dtype with its compiled parts")
    parser.add_argument("--batch", type=int, default=1, help="windows ffai's text stage decodes together")
    args = parser.parse_args(argv)
    if args.arm == FfaiArm.name:
        host.share_cores()  # as `ffai` runs; the reference runs as its users run it
    return print_result(
        lambda: run(
            args.arm,
            args.case,
            args.model,
            engine=args.engine,
            dtype=args.dtype,
            cores=args.cores,
            clip=args.clip,
            corpus=args.corpus,
            quality_n=args.quality_n,
            compile=args.compile,
            batch=args.batch,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
