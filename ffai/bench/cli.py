"""`ffai bench vlm`: ffai's engine against its reference implementation, four gates, one ledger line.

    ffai bench vlm [--engine NAME] [--model NAME|PATH] [--cases frame,still,window,clip] [--repeats N]
                   [--dtype float32|bfloat16|int8] [--compile] [--batch B|auto] [--busy N]
                   [--quality-corpus DIR] [--json] [--ledger FILE]

How a run goes (choices documented here, in one place):

- The engine: ``--engine`` (default: the default engine, SmolVLM), benched through its bench
  hooks (``ffai.bench.hooks``): its reference arm, its random checkpoints, its probes for the
  precision run. SmolVLM's reference is transformers' Idefics3 (``ffai.engines.smolvlm.bench``).
- The checkpoint: ``--model`` (name or folder), else the engine's first random checkpoint
  (SmolVLM's: the real SmolVLM-256M shapes with random weights), written once to
  ``.cache/checkpoints/smolvlm-real-*`` (speed and memory do not depend on the weights'
  values). What the reference needs (transformers, ``pip install 'ffai[reference]'``) is
  checked first.
- Every (arm, case, repeat) runs in a fresh subprocess (``python -m ffai.bench.arms``): load
  (untimed), warm-up on the case's first item (untimed), the case once (timed). Per case the
  arms alternate ABBA over the repeats (A B, B A, A B, ...), so load drifts on shared cores
  weigh on both. Minimum and median over the repeats are reported; the speed gate and the
  speed-up use the median. A warm-up per process costs about one extra item per run; it buys
  a fresh process per measurement, so each arm's peak RSS is its own (for ffai the whole
  process tree: the main process and its pipeline workers, when it has any).
- Both arms get the same cores: the reference one process with that many torch threads, ffai
  its stages placed and threaded as ``ffai caption`` places a video run on that many cores
  (``ffai.run.captioner.placement``: one process taking turns on 2 cores or fewer).
- Per case, once, untimed: the precision run (``python -m ffai.bench.agreement``), ffai alone
  in ``--dtype`` on the case's items with the engine's per-token timestamps (prefill, decode
  ms/token), beside the machine's memory bandwidth and the decode floor it sets; for an opt-in
  dtype (``int8``, ``bfloat16``) the same process runs ffai in float32 too, for the agreement
  gate (cosines of tile embeddings and prefill logits, tokens agreeing with float32), which
  replaces the correctness gate; ffai's timed arm still runs in ``--dtype`` against the
  float32 reference, and the speed and RSS targets are the dtype's (``gates``).
- The CPU: its model and the flags that decide which dtype is fast, in the report and the
  ledger, so figures from different machines are never compared blindly; beside it the load
  average when the run started and ended (on shared cores torch's threads wait on each other,
  and a busy machine can slow a 2-thread arm several times over).
- Quality: with ``--quality-corpus DIR`` (images + questions.jsonl), or when the model is the
  bundled ``smolvlm-demo`` (its held-out scenes), each arm answers once more in its own
  process; otherwise the gate is SKIP.
- ``--compile``: ffai's arm and its precision run load as ``ffai caption --compile`` does (an
  opt-in dtype with the parts the engine compiles for this machine). One load before the cases,
  untimed, builds them if the machine's cache lacks them; its wall time is reported.
- ``--batch``: the windows ffai's text stage decodes together, read as ``ffai caption --batch``
  reads it (auto: 4 on a CPU). Above 1, the clip case runs a third arm, ``reference-batched``
  (the reference's ``clip_batched``: B windows a ``generate``, left-padded), in the same ABBA
  turns; its speed-up is reported beside the per-window one, never gated.
- ``--busy N``: every case also runs ffai's arm with N busy programs beside it (a Python loop
  each, started before the arm's process and stopped after it), in the same ABBA turns: how ffai
  shares the cores with a machine's other work. Its time against ffai's quiet time is reported
  (target: at most 2.2x with one busy program on 2 cores), never gated.
- Output: a rich table on stderr, the report as JSON on stdout with ``--json``, one line
  appended to the ledger (``--ledger FILE``, default ``$FFAI_HOME/bench/ledger.jsonl``).
- Exit status: 0 when no gate FAILed (SKIP is not a failure, and not a pass), 1 when any did —
  a bench is a gate; ``--no-fail`` reports and exits 0 anyway. Targets never decide the exit.
"""

from __future__ import annotations

import json
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer

from ffai.bench import cases as inputs
from ffai.bench import checkpoints, gates, ledger
from ffai.engines.contract import RuntimeOptions
from ffai.errors import EngineError, UsageError

bench_app = typer.Typer(help="Benchmark ffai against a reference implementation.", no_args_is_help=True)

MIB = 2**20
QUALITY = "quality"  # the arms' name for the quality run (ffai.bench.arms.QUALITY)


@dataclass(frozen=True)
class BenchOptions:
    engine: str | None = None
    model: str | None = None
    cases: tuple[str, ...] = inputs.CASES
    repeats: int = 2
    dtype: str = "float32"
    quality_corpus: Path | None = None
    quality_n: int = inputs.DEMO_N
    cores: int | None = None
    compile: bool = False
    batch: int = 1
    busy: int = 0

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
        RuntimeOptions(dtype=self.dtype, compile=self.compile, batch=self.batch)  # its checks of these flags
        if self.quality_n < 1:
            raise UsageError("--quality-n must be at least 1")
        if self.cores is not None and self.cores < 1:
            raise UsageError("--cores must be at least 1")
        if self.busy < 0:
            raise UsageError("--busy must be 0 or more")
        if self.quality_corpus is not None and not (self.quality_corpus / inputs.CORPUS_QUESTIONS).is_file():
            raise UsageError(f"--quality-corpus {self.quality_corpus}: no {inputs.CORPUS_QUESTIONS} in this folder")


def parse_batch(text: str, compile: bool) -> int:
    """``--batch`` as ``ffai caption`` reads it, on the CPU the bench runs on."""
    from ffai.run.options import parse_batch

    return parse_batch(text, "cpu", compile)


def parse_cases(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


@contextmanager
def busy_programs(n: int) -> Iterator[None]:
    """``n`` programs that keep a core each busy (a Python loop in a process of its own), as a
    browser or a build beside ffai would, for the length of the block."""
    import subprocess

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def run_arm(arm: str, case: str, model_dir: Path, options: BenchOptions, cores: int, **paths: Path | None) -> dict:
    """One arm on one case in a fresh process; its JSON result plus the process tree's peak RSS.
    ``gates.BUSY`` is ffai's arm with ``options.busy`` busy programs beside it."""
    from ffai.bench import arms
    from ffai.kit.host import run_measured

    if arm == gates.BUSY:
        with busy_programs(options.busy):
            result = run_arm(gates.ARMS[0], case, model_dir, options, cores, **paths)
        return {**result, "busy_loops": options.busy, "cores": cores}
    cmd = arms.command(
        arm,
        case,
        model_dir,
        engine=options.engine,
        dtype=options.dtype,
        cores=cores,
        quality_n=options.quality_n,
        compile=options.compile,
        batch=options.batch,
        **paths,
    )
    proc, peak, wall = run_measured(cmd)
    return {**_result(proc, f"the {arm} arm", case), "peak_rss": peak, "wall_s": round(wall, 3)}


def run_precision(case: str, model_dir: Path, options: BenchOptions, cores: int, clip: Path | None) -> dict:
    """The case's untimed precision run (``ffai.bench.agreement``) in a fresh process; its JSON."""
    import subprocess

    from ffai.bench import agreement

    cmd = agreement.command(
        case,
        model_dir,
        engine=options.engine,
        dtype=options.dtype,
        cores=cores,
        clip=clip,
        compile=options.compile,
        batch=options.batch,
    )
    return _result(subprocess.run(cmd, capture_output=True, text=True), "the precision run", case)


def _result(proc, what: str, case: str) -> dict:
    """The JSON line a bench subprocess printed last, or its one-line error as an EngineError."""
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        reason = next((line for line in lines if line.startswith("ffai: error:")), lines[-1] if lines else "no output")
        raise EngineError(f"{what} failed on the {case} case: {reason.removeprefix('ffai: error: ')}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(options: BenchOptions, log: Callable[[str], None] = lambda message: None) -> dict:
    """Run both arms over the cases (and the quality corpus when there is one); the report."""
    from ffai import models
    from ffai.bench.hooks import hooks_for
    from ffai.engines import registry
    from ffai.run.captioner import available_cores

    # A model named by its manifest is benched on the manifest's engine, as ffai caption runs it.
    engine = registry.engine_for_model(options.engine, options.model).info.name
    options = replace(options, engine=engine)
    hooks_for(engine).check_reference()
    model_dir = models.resolve(options.model) if options.model else checkpoints.default_checkpoint(engine, log)
    corpus = "demo" if options.quality_corpus is None and inputs.is_demo_model(model_dir) else options.quality_corpus
    cores = options.cores or available_cores()
    cpu = ledger.cpu_identity()
    load = {"start": ledger.load_average()}
    # With --batch above 1, the clip case also faces the reference batched with padding, when it can.
    batched = (
        frozenset({"clip"} & set(options.cases))
        if options.batch > 1 and _reference_batches(engine, model_dir)
        else frozenset()
    )
    runs: dict[str, dict[str, list[dict]]] = {
        case: {arm: [] for arm in (*gates.ARMS, gates.BATCHED, gates.BUSY)} for case in options.cases
    }
    precision: dict[str, dict] = {}
    first_load = None
    if options.compile:
        # What --compile builds is built once per machine, by the first load: here, untimed and
        # outside the arms' peak RSS, as a user pays it once before the runs that follow.
        from ffai.bench.arms import LOAD

        first_load = run_arm("ffai", LOAD, model_dir, options, cores)
        log(f"ffai's first load, untimed (its compiled parts built or read): {first_load['wall_s']:.1f} s")
    with tempfile.TemporaryDirectory(prefix="ffai-bench-") as tmp:
        clip = inputs.write_clip(Path(tmp) / "clip.mp4") if "clip" in options.cases else None
        for case, r, arm in gates.schedule(list(options.cases), options.repeats, batched, options.busy > 0):
            result = run_arm(arm, case, model_dir, options, cores, clip=clip if case == "clip" else None)
            log(
                f"{case} {r + 1}/{options.repeats} {arm}: {result['time_s']:.2f} s, "
                f"peak RSS {result['peak_rss'] / MIB:.0f} MiB"
            )
            runs[case][arm].append(result)
        for case in options.cases:
            precision[case] = run_precision(case, model_dir, options, cores, clip if case == "clip" else None)
            log(f"{case} precision: {_precision_line(precision[case])}")
    quality = None
    if corpus is not None:
        quality = {"corpus": str(corpus)}
        for arm in gates.ARMS:
            path = None if corpus == "demo" else corpus
            result = run_arm(arm, QUALITY, model_dir, options, cores, corpus=path)
            quality[arm] = {k: result[k] for k in ("correct", "total", "time_s", "answers")}
            log(f"quality {arm}: {result['correct']}/{result['total']}")
    flags = frozenset(cpu["flags"])
    records = [
        gates.summarize_case(
            case, runs[case], options.dtype, precision[case], flags, inputs.CLIP_SECONDS if case == "clip" else None
        )
        for case in options.cases
    ]
    results = gates.gates(records, quality, options.dtype)
    load["end"] = ledger.load_average()
    return {
        "engine": engine,
        "model": str(model_dir),
        "dtype": options.dtype,
        "compile": options.compile,
        "batch": options.batch,
        "busy": options.busy,
        "first_load_s": None if first_load is None else first_load["wall_s"],
        "repeats": options.repeats,
        "cores": cores,
        "cpu": cpu,
        "load_average": load,
        "cases": records,
        "quality": quality,
        "gates": results,
        "passed": gates.passed(results),
    }


def _reference_batches(engine: str, model_dir: Path) -> bool:
    """Whether the engine's reference arm can decode several windows in one batch."""
    from ffai.bench.hooks import hooks_for

    return hasattr(hooks_for(engine).reference(model_dir, 1), "clip_batched")


def _precision_line(result: dict) -> str:
    floor = result["floor"]
    decode = result["decode_ms_per_token"]
    line = (
        f"prefill {result['prefill_s']:.2f} s, decode {decode} ms/token, floor {floor['ms']:.2f} ms "
        f"({floor['bytes'] / 1e6:.0f} MB at {floor['bandwidth_gb_s']} GB/s)"
    )
    if result.get("batch_decode"):
        b = result["batch_decode"]
        line += f"; {b['rows']} rows a step: {b['ms_per_row']} ms/token each ({b['ratio']:.2f}x one row's)"
    if result["tile_cosines"] is None:
        return line
    tile = min(c for cosines in result["tile_cosines"].values() for c in cosines)
    return f"{line}; cosine with float32: tiles ≥ {tile:.5f}, logits ≥ {min(result['logits_cosines'].values()):.5f}"


# --- presentation --------------------------------------------------------------------------

_STYLES = {gates.PASS: "green", gates.FAIL: "bold red", gates.SKIP: "yellow"}


def _times(arm: dict) -> str:
    return f"{arm['min_s']:.2f}/{arm['median_s']:.2f}"


def _mark(met: bool | None) -> str:
    return "" if met is None else " ✓" if met else " ✗"


def _tokens(record: dict) -> str:
    """float32: the arms' tokens "same" (or the share that is); other dtypes: "agree N/32" with float32."""
    precision = record["precision"]
    if precision is not None and "tokens" in precision:
        return f"agree {precision['tokens']['same']}/{precision['tokens']['total']}"
    return "same" if record["tokens"]["equal"] else f"{100 * record['tokens']['agreement']:.0f}% same"


def _load(load: dict) -> str:
    return " → ".join("?" if load[k] is None else f"{load[k]:.1f}" for k in ("start", "end"))


def cpu_line(cpu: dict) -> str:
    return f"{cpu['model'] or 'unknown CPU'} ({' '.join(cpu['flags']) or 'no flags listed'})"


def render(report: dict, console) -> None:
    """The cases table, the precision table and the gates table, for people (stderr)."""
    from rich.table import Table

    records = report["cases"]
    targets = ", ".join(
        f"{r['case']} ≥{r['speedup_target']}x" if r["speedup_target"] else f"{r['case']} none" for r in records
    )
    rss_target = records[0]["rss_target"] if records else None
    table = Table(
        title=f"ffai bench vlm ({report['dtype']}{', compiled' if report.get('compile') else ''}, "
        f"{report['repeats']} repeats, {report['cores']} cores)",
        caption=f"{report['model']}\n{cpu_line(report['cpu'])}, load average {_load(report['load_average'])}\n"
        f"times in s (min/median); targets: speed-up {targets}; RSS ratio ≤{rss_target}x",
    )
    for column in ("case", "items", "ffai s", "ref s", "speed-up", "ffai MiB", "ref MiB", "RSS ratio", "tokens"):
        table.add_column(column, justify="left" if column in ("case", "tokens") else "right")
    for r in records:
        table.add_row(
            r["case"],
            str(r["tokens"]["items"]),
            _times(r["ffai"]),
            _times(r["reference"]),
            f"{r['speedup_median']:.2f}x{_mark(r['speedup_target_met'])}",
            f"{r['ffai']['peak_rss'] / MIB:.0f}",
            f"{r['reference']['peak_rss'] / MIB:.0f}",
            f"{r['rss_ratio']:.2f}x{_mark(r['rss_target_met'])}",
            _tokens(r),
        )
    console.print(table)
    render_throughput(report, console)
    render_precision(report, console)
    checks = Table(title="gates")
    for column in ("gate", "status", "detail"):
        checks.add_column(column)
    for name, gate in report["gates"].items():
        checks.add_row(name, f"[{_STYLES[gate['status']]}]{gate['status']}[/]", gate["detail"])
    console.print(checks)


def render_throughput(report: dict, console) -> None:
    """Per case: items a second and, for the clip, seconds of video a second (real-time factor);
    with the batched reference, its time and ffai's speed-up over it."""
    from rich.table import Table

    records = report["cases"]
    batched = [r for r in records if "reference_batched" in r]
    table = Table(
        title=f"throughput (ffai --batch {report.get('batch', 1)})",
        caption="RTF: seconds of video per second of wall time (median runs)"
        + (
            f"; batched reference: {batched[0]['reference_batched']['batch']} windows a generate, padded"
            if batched
            else ""
        ),
    )
    busy = [r for r in records if "busy" in r]
    columns = ["case", "ffai items/s", "ref items/s", "ffai RTF", "ref RTF"]
    if batched:
        columns += ["batched ref s", "vs batched ref", "batched ref tokens"]
    if busy:
        columns += [f"ffai s, {busy[0]['busy']['loops']} busy", "busy / quiet"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("case", "batched ref tokens") else "right")
    for r in records:
        speeds = r["throughput"]
        rtf = [("–" if speeds[arm]["realtime"] is None else f"{speeds[arm]['realtime']:.2f}") for arm in gates.ARMS]
        row = [r["case"], *(f"{speeds[arm]['items_per_s']:.2f}" for arm in gates.ARMS), *rtf]
        if batched:
            if "reference_batched" in r:
                tokens = r["batched_reference_tokens"]
                same = "same" if tokens["equal"] else f"{100 * tokens['agreement']:.0f}% same"
                row += [
                    _times(r["reference_batched"]),
                    f"{r['speedup_batched_median']:.2f}x{_mark(r['speedup_batched_target_met'])}",
                    same,
                ]
            else:
                row += ["–", "–", "–"]
        if busy:
            row += [_times(r["busy"]), f"{r['busy_ratio']:.2f}x{_mark(r['busy_target_met'])}"]
        table.add_row(*row)
    console.print(table)


def _divergence(precision: dict) -> str:
    """Where each item's tokens first left float32's: the position, or "item: position" per item."""
    positions = precision["first_divergence"]
    if len(positions) == 1:
        [position] = positions.values()
        return "none" if position is None else str(position)
    return ", ".join(f"{item}: {position}" for item, position in positions.items() if position is not None) or "none"


def render_precision(report: dict, console) -> None:
    """Per case: agreement with float32 (opt-in dtypes) and decode time per token against the floor."""
    from rich.table import Table

    records = [r for r in report["cases"] if r["precision"] is not None]
    if not records:
        return
    agreement = report["dtype"] != "float32"
    first = records[0]["precision"]
    floor_target = f", decode ≤{first['floor_target']}x the floor" if first["floor_target"] else ""
    table = Table(
        title=f"precision ({report['dtype']}, untimed run, {first['threads']} threads)",
        caption=(f"cosine with float32 ≥{first['cosine_target']} (gated); tokens not gated\n" if agreement else "")
        + f"floor: text tower + LM head at {report['dtype']} width / torch.sum bandwidth{floor_target}",
    )
    columns = ("case", "tile cos min", "logits cos min", "tokens", "first divergence") if agreement else ("case",)
    for column in (*columns, "prefill s", "decode ms/token", "floor ms", "GB/s", "decode/floor"):
        table.add_column(column, justify="left" if column in ("case", "tokens", "first divergence") else "right")
    for r in records:
        p = r["precision"]
        row = [r["case"]]
        if agreement:
            row += [f"{p['tile_cosine_min']:.5f}", f"{p['logits_cosine_min']:.5f}", _tokens(r), _divergence(p)]
        ratio = "–" if p["floor_ratio"] is None else f"{p['floor_ratio']:.2f}x{_mark(p['floor_target_met'])}"
        decode = "–" if p["decode_ms_per_token"] is None else f"{p['decode_ms_per_token']:.2f}"
        row += [f"{p['prefill_s']:.2f}", decode, f"{p['floor_ms']:.2f}", f"{p['bandwidth_gb_s']:.1f}", ratio]
        table.add_row(*row)
    console.print(table)


@bench_app.command("vlm")
def vlm(
    engine: Annotated[
        Optional[str],
        typer.Option("--engine", help="Engine to bench, through its bench hooks (default: the default engine)."),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            help="Model name or checkpoint folder (default: the engine's random checkpoint; SmolVLM's has the "
            "real SmolVLM-256M shapes).",
        ),
    ] = None,
    case_list: Annotated[
        str, typer.Option("--cases", help="Comma-separated subset of frame,still,window,clip.")
    ] = ",".join(inputs.CASES),
    repeats: Annotated[int, typer.Option("--repeats", help="Timed runs per arm and case (ABBA order).")] = 2,
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="ffai's dtype: float32 (exact), or int8 / bfloat16 (opt-in, their agreement with float32 gated).",
        ),
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
    compile_: Annotated[
        bool,
        typer.Option(
            "--compile", help="ffai's opt-in dtype with its compiled parts, as `ffai caption --compile` runs it."
        ),
    ] = False,
    batch: Annotated[
        str,
        typer.Option("--batch", help="Windows ffai's text stage decodes together, as `ffai caption --batch` reads it."),
    ] = "auto",
    busy: Annotated[
        int,
        typer.Option("--busy", help="Also time ffai with this many busy programs beside it, each keeping a core busy."),
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    ledger_path: Annotated[
        Optional[Path],
        typer.Option("--ledger", help="Append one JSON line per run here (default: $FFAI_HOME/bench/ledger.jsonl)."),
    ] = None,
    no_fail: Annotated[bool, typer.Option("--no-fail", help="Exit 0 even when a gate fails.")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress lines on stderr.")] = False,
) -> None:
    """ffai against the engine's reference (SmolVLM's: transformers): correctness, quality, footprint and speed gates."""
    from rich.console import Console

    options = BenchOptions(
        engine=engine,
        model=model,
        cases=parse_cases(case_list),
        repeats=repeats,
        dtype=dtype,
        quality_corpus=quality_corpus,
        quality_n=quality_n,
        cores=cores,
        compile=compile_,
        batch=parse_batch(batch, compile_),
        busy=busy,
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
