"""`ffai bench vlm`: ffai's engine against the transformers reference, four gates, one ledger line.

    ffai bench vlm [--model NAME|PATH] [--cases frame,still,window,clip] [--repeats N]
                   [--dtype float32|bfloat16] [--quality-corpus DIR] [--json] [--ledger FILE]

How a run goes (choices documented here, in one place):

- The checkpoint: ``--model`` (name or folder), else the real SmolVLM-256M shapes with random
  weights, written once to ``.cache/checkpoints/real-*`` (speed and memory do not depend on
  the weights' values). transformers (``pip install 'ffai[reference]'``) is checked first.
- Every (arm, case, repeat) runs in a fresh subprocess (``python -m ffai.bench.arms``): load
  (untimed), warm-up on the case's first item (untimed), the case once (timed). Per case the
  arms alternate ABBA over the repeats (A B, B A, A B, ...), so load drifts on shared cores
  weigh on both. Minimum and median over the repeats are reported; the speed gate and the
  speed-up use the median. A warm-up per process costs about one extra item per run; it buys
  a fresh process per measurement, so each arm's peak RSS is its own (for ffai the whole
  process tree: the main process and its pipeline workers, when it has any).
- Both arms get the same cores: the reference one process with that many torch threads, ffai
  its stages placed and threaded as ``ffai caption`` places a video run on that many cores
  (``ffai.captioning.placement``: one process taking turns on 2 cores or fewer).
- ``--dtype bfloat16`` runs ffai in bfloat16 against the float32 reference: the token
  agreement is reported and the correctness gate is SKIP; the RSS target becomes 0.5x.
- Quality: with ``--quality-corpus DIR`` (images + questions.jsonl), or when the model is the
  bundled ``smolvlm-demo`` (its held-out scenes), each arm answers once more in its own
  process; otherwise the gate is SKIP.
- Output: a rich table on stderr, the report as JSON on stdout with ``--json``, one line
  appended to the ledger (``--ledger FILE``, default ``$FFAI_HOME/bench/ledger.jsonl``).
- Exit status: 0 when no gate FAILed (SKIP is not a failure, and not a pass), 1 when any did —
  a bench is a gate; ``--no-fail`` reports and exits 0 anyway. Targets never decide the exit.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from ffai.bench import cases as inputs
from ffai.bench import checkpoints, gates, ledger
from ffai.engine import DTYPES
from ffai.errors import EngineError, UsageError

bench_app = typer.Typer(help="Benchmark ffai against a reference implementation.", no_args_is_help=True)

MIB = 2**20
QUALITY = "quality"  # the arms' name for the quality run (ffai.bench.arms.QUALITY)


@dataclass(frozen=True)
class BenchOptions:
    model: str | None = None
    cases: tuple[str, ...] = inputs.CASES
    repeats: int = 2
    dtype: str = "float32"
    quality_corpus: Path | None = None
    quality_n: int = inputs.DEMO_N
    cores: int | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise UsageError("--repeats must be at least 1")
        if not self.cases:
            raise UsageError("--cases needs at least one case")
        unknown = [c for c in self.cases if c not in inputs.CASES]
        if unknown:
            raise UsageError(f"--cases: unknown case {unknown[0]!r} (known: {', '.join(inputs.CASES)})")
        if len(set(self.cases)) != len(self.cases):
            raise UsageError("--cases: a case is named twice")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
        if self.quality_n < 1:
            raise UsageError("--quality-n must be at least 1")
        if self.cores is not None and self.cores < 1:
            raise UsageError("--cores must be at least 1")
        if self.quality_corpus is not None and not (self.quality_corpus / inputs.CORPUS_QUESTIONS).is_file():
            raise UsageError(f"--quality-corpus {self.quality_corpus}: no {inputs.CORPUS_QUESTIONS} in this folder")


def parse_cases(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


def run_arm(arm: str, case: str, model_dir: Path, options: BenchOptions, cores: int, **paths: Path | None) -> dict:
    """One arm on one case in a fresh process; its JSON result plus the process tree's peak RSS."""
    from ffai.bench import arms
    from ffai.rss import run_measured

    cmd = arms.command(arm, case, model_dir, dtype=options.dtype, cores=cores, quality_n=options.quality_n, **paths)
    proc, peak, wall = run_measured(cmd)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        reason = next((line for line in lines if line.startswith("ffai: error:")), lines[-1] if lines else "no output")
        raise EngineError(f"the {arm} arm failed on the {case} case: {reason.removeprefix('ffai: error: ')}")
    lines = proc.stdout.strip().splitlines()
    return {**json.loads(lines[-1]), "peak_rss": peak, "wall_s": round(wall, 3)}


def run_bench(options: BenchOptions, log: Callable[[str], None] = lambda message: None) -> dict:
    """Run both arms over the cases (and the quality corpus when there is one); the report."""
    from ffai import models
    from ffai.captioning import available_cores

    inputs.require_reference()
    model_dir = models.resolve(options.model) if options.model else checkpoints.default_checkpoint(log)
    corpus = "demo" if options.quality_corpus is None and inputs.is_demo_model(model_dir) else options.quality_corpus
    cores = options.cores or available_cores()
    runs: dict[str, dict[str, list[dict]]] = {case: {arm: [] for arm in gates.ARMS} for case in options.cases}
    with tempfile.TemporaryDirectory(prefix="ffai-bench-") as tmp:
        clip = inputs.write_clip(Path(tmp) / "clip.mp4") if "clip" in options.cases else None
        for case, r, arm in gates.schedule(list(options.cases), options.repeats):
            result = run_arm(arm, case, model_dir, options, cores, clip=clip if case == "clip" else None)
            log(
                f"{case} {r + 1}/{options.repeats} {arm}: {result['time_s']:.2f} s, "
                f"peak RSS {result['peak_rss'] / MIB:.0f} MiB"
            )
            runs[case][arm].append(result)
    quality = None
    if corpus is not None:
        quality = {"corpus": str(corpus)}
        for arm in gates.ARMS:
            path = None if corpus == "demo" else corpus
            result = run_arm(arm, QUALITY, model_dir, options, cores, corpus=path)
            quality[arm] = {k: result[k] for k in ("correct", "total", "time_s", "answers")}
            log(f"quality {arm}: {result['correct']}/{result['total']}")
    records = [gates.summarize_case(case, runs[case], options.dtype) for case in options.cases]
    results = gates.gates(records, quality, options.dtype)
    return {
        "model": str(model_dir),
        "dtype": options.dtype,
        "repeats": options.repeats,
        "cores": cores,
        "cases": records,
        "quality": quality,
        "gates": results,
        "passed": gates.passed(results),
    }


# --- presentation --------------------------------------------------------------------------

_STYLES = {gates.PASS: "green", gates.FAIL: "bold red", gates.SKIP: "yellow"}


def _times(arm: dict) -> str:
    return f"{arm['min_s']:.2f}/{arm['median_s']:.2f}"


def _mark(met: bool) -> str:
    return "✓" if met else "✗"


def render(report: dict, console) -> None:
    """The cases table and the gates table, for people (stderr)."""
    from rich.table import Table

    records = report["cases"]
    targets = ", ".join(f"{r['case']} ≥{r['speedup_target']}x" for r in records)
    rss_target = records[0]["rss_target"] if records else None
    table = Table(
        title=f"ffai bench vlm ({report['dtype']}, {report['repeats']} repeats, {report['cores']} cores)",
        caption=f"{report['model']}\ntimes in s (min/median); targets: speed-up {targets}; RSS ratio ≤{rss_target}x",
    )
    for column in ("case", "items", "ffai s", "ref s", "speed-up", "ffai MiB", "ref MiB", "RSS ratio", "tokens"):
        table.add_column(column, justify="left" if column in ("case", "tokens") else "right")
    for r in records:
        tokens = "same" if r["tokens"]["equal"] else f"{100 * r['tokens']['agreement']:.0f}% same"
        table.add_row(
            r["case"],
            str(r["tokens"]["items"]),
            _times(r["ffai"]),
            _times(r["reference"]),
            f"{r['speedup_median']:.2f}x {_mark(r['speedup_target_met'])}",
            f"{r['ffai']['peak_rss'] / MIB:.0f}",
            f"{r['reference']['peak_rss'] / MIB:.0f}",
            f"{r['rss_ratio']:.2f}x {_mark(r['rss_target_met'])}",
            tokens,
        )
    console.print(table)
    checks = Table(title="gates")
    for column in ("gate", "status", "detail"):
        checks.add_column(column)
    for name, gate in report["gates"].items():
        checks.add_row(name, f"[{_STYLES[gate['status']]}]{gate['status']}[/]", gate["detail"])
    console.print(checks)


@bench_app.command("vlm")
def vlm(
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model", help="Model name or checkpoint folder (default: real SmolVLM-256M shapes, random weights)."
        ),
    ] = None,
    case_list: Annotated[
        str, typer.Option("--cases", help="Comma-separated subset of frame,still,window,clip.")
    ] = ",".join(inputs.CASES),
    repeats: Annotated[int, typer.Option("--repeats", help="Timed runs per arm and case (ABBA order).")] = 2,
    dtype: Annotated[
        str, typer.Option("--dtype", help="ffai's dtype: float32, or bfloat16 (against the float32 reference).")
    ] = "float32",
    quality_corpus: Annotated[
        Optional[Path],
        typer.Option("--quality-corpus", help="Folder of images + questions.jsonl for the quality gate."),
    ] = None,
    quality_n: Annotated[
        int, typer.Option("--quality-n", help="Held-out scenes asked of the demo model.")
    ] = inputs.DEMO_N,
    cores: Annotated[
        Optional[int], typer.Option("--cores", help="Cores both arms may use (default: all available).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    ledger_path: Annotated[
        Optional[Path],
        typer.Option("--ledger", help="Append one JSON line per run here (default: $FFAI_HOME/bench/ledger.jsonl)."),
    ] = None,
    no_fail: Annotated[bool, typer.Option("--no-fail", help="Exit 0 even when a gate fails.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress lines on stderr.")] = False,
) -> None:
    """ffai against the transformers reference: correctness, quality, footprint and speed gates."""
    from rich.console import Console

    options = BenchOptions(
        model=model,
        cases=parse_cases(case_list),
        repeats=repeats,
        dtype=dtype,
        quality_corpus=quality_corpus,
        quality_n=quality_n,
        cores=cores,
    )

    def log(message: str) -> None:
        if not quiet:
            print(f"ffai bench: {message}", file=sys.stderr, flush=True)

    report = run_bench(options, log)
    render(report, Console(stderr=True, highlight=False))
    ledger.append(ledger_path, ledger.ledger_line(report))
    if as_json:
        typer.echo(json.dumps(report, ensure_ascii=False, indent=2))
    if not report["passed"] and not no_fail:
        raise typer.Exit(1)
