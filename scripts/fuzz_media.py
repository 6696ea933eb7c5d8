"""Fuzz ffai's front door with seeded mutations of every sample kind (scripts/fuzz.py); print a summary.

    python scripts/fuzz_media.py --count 10000                 # probing + sampling, a forked child per file
    python scripts/fuzz_media.py --count 200 --cli             # the whole `ffai caption` path per file
    python scripts/fuzz_media.py --count 50 --first-seed 9000 --keep found/   # keep the files it flags
    python scripts/fuzz_media.py --atheris -max_total_time=600   # coverage-guided, in this process

Media path: each file runs through ``fuzz.check`` (probe, then the still or 4 samples at 1 fps)
in a child forked from this process, so a crash inside FFmpeg or Pillow is a *death* of that child,
not of the run. CLI path: ``ffai caption -i F --fps 1 --window 2 --max-frames 4 -f jsonl -o - -q``
with the tiny checkpoint, in a subprocess per file. Either way a file is a *traceback* (a Python
exception other than a one-line MediaError / ``ffai: error:``), a *hang* (past --timeout), a
*death* (killed by a signal), *multi-line* (a failure that is not exactly one stderr line), or
clean. Peak RSS per file is compared with the same run on the unmutated sample (media path: the
child's ru_maxrss; CLI path: the whole process tree's peak, sampled).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import fuzz

FINDINGS = ("traceback", "hang", "death", "multi-line")


def run_media(path: Path, timeout: float) -> dict:
    """``fuzz.check(path)`` in a forked child: its outcome, or how it failed, and its peak RSS."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code
        os.close(read)
        try:
            outcome = fuzz.check(path)
            result = {"class": "error" if outcome.kind == "error" else "ok", "message": outcome.message}
            if "\n" in outcome.message:
                result["class"] = "multi-line"
        except BaseException:
            result = {"class": "traceback", "message": traceback.format_exc()}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    chunks, deadline, status, usage = [], time.monotonic() + timeout, None, None
    while status is None:
        ready, _, _ = select.select([read], [], [], 0.05)
        if ready:
            chunk = os.read(read, 1 << 16)
            if chunk:
                chunks.append(chunk)
        done, status_word, usage = os.wait4(pid, os.WNOHANG)
        if done:
            status = status_word
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            os.close(read)
            return {"class": "hang", "message": f"past {timeout:g} s", "rss": usage.ru_maxrss * 1024}
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    rss = usage.ru_maxrss * 1024
    if os.WIFSIGNALED(status):
        return {"class": "death", "message": signal.Signals(os.WTERMSIG(status)).name, "rss": rss}
    result = json.loads(b"".join(chunks) or b'{"class": "death", "message": "no result"}')
    return {**result, "rss": rss}


def run_cli(path: Path, timeout: float, checkpoint: Path) -> dict:
    """The whole ``ffai caption`` path on `path` in a subprocess: how it ended and the tree's peak RSS."""
    from ffai.kit.host import PeakRSS

    cmd = [sys.executable, "-m", "ffai", "caption", "-i", str(path), "--fps", "1", "--window", "2"]
    cmd += ["--max-frames", "4", "-f", "jsonl", "-o", "-", "-q", "--model", str(checkpoint)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakRSS(proc.pid) as peak:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"class": "hang", "message": f"past {timeout:g} s", "rss": peak.peak}
    lines = err.splitlines()
    if proc.returncode < 0:
        found = {"class": "death", "message": signal.Signals(-proc.returncode).name}
    elif "Traceback" in err:
        found = {"class": "traceback", "message": err}
    elif proc.returncode == 0:
        # -q: a captioned file prints nothing on stderr, and every jsonl line is a cue
        ok = not lines and all(json.loads(line)["text"] is not None for line in out.splitlines())
        found = {"class": "ok" if ok else "multi-line", "message": err}
    elif len(lines) == 1 and lines[0].startswith("ffai: error: ") and str(path) in lines[0]:
        found = {"class": "error", "message": lines[0]}
    else:
        found = {"class": "multi-line", "message": err}
    return {**found, "rss": peak.peak}


def run_atheris(samples: dict[str, Path], work: Path, libfuzzer_args: list[str]) -> None:
    """Coverage-guided fuzzing of probing and sampling with atheris (``pip install atheris``),
    seeded with the samples; libFuzzer's own flags pass through (``-max_total_time=600`` ...).
    In this process: a crash in FFmpeg or Pillow stops the run with the input saved, as
    libFuzzer does, and any exception but a MediaError is a finding."""
    import atheris

    atheris.instrument_all()  # ffai.media and Pillow are imported already: instrument what is loaded
    suffixes = sorted({path.suffix for path in samples.values()})

    def one_input(data: bytes) -> None:
        # The content decides the kind; the suffix only varies what the demuxers guess first.
        path = work / f"input{suffixes[len(data) % len(suffixes)]}"
        path.write_bytes(data)
        fuzz.check(path)

    corpus = work / "corpus"
    corpus.mkdir()
    for path in samples.values():
        (corpus / path.name).write_bytes(path.read_bytes())
    atheris.Setup([sys.argv[0], *libfuzzer_args, str(corpus)], one_input)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="mutated files to run")
    parser.add_argument("--first-seed", type=int, default=0, help="seed of the first file (seeds run in order)")
    parser.add_argument("--cli", action="store_true", help="the whole `ffai caption` path (slow: a process per file)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a file counts as a hang")
    parser.add_argument("--samples", type=Path, help="folder for the unmutated samples (default: a temporary one)")
    parser.add_argument("--keep", type=Path, help="copy every flagged file here, with its recipe")
    parser.add_argument("--json", action="store_true", help="one JSON line per file on stdout")
    parser.add_argument(
        "--atheris", action="store_true", help="coverage-guided fuzzing instead (needs atheris; libFuzzer flags follow)"
    )
    args, rest = parser.parse_known_args(argv)
    if rest and not args.atheris:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    with tempfile.TemporaryDirectory(prefix="ffai-fuzz-") as tmp:
        work = Path(tmp)
        samples = fuzz.make_samples(args.samples or work / "samples")
        if args.atheris:
            run_atheris(samples, work, rest)
            return 0
        if args.cli:
            from ffai.bench import checkpoints

            checkpoint = checkpoints.checkpoint("tiny")

            def run(p: Path) -> dict:
                return run_cli(p, args.timeout, checkpoint)
        else:

            def run(p: Path) -> dict:
                return run_media(p, args.timeout)

        baseline = {name: run(path)["rss"] for name, path in samples.items()}
        classes: Counter[str] = Counter()
        worst_ratio, worst_case, over_rss, started = 0.0, None, 0, time.monotonic()
        for case in fuzz.cases(samples, args.count, args.first_seed):
            path = case.write(samples, work)
            result = run(path)
            ratio = result["rss"] / baseline[case.sample] if baseline[case.sample] else 0.0
            classes[result["class"]] += 1
            if ratio > worst_ratio:
                worst_ratio, worst_case = ratio, case.name
            if args.json:
                print(json.dumps({"case": case.name, "recipe": case.recipe, **result, "rss_ratio": round(ratio, 3)}))
            over_rss += ratio > 2.0
            if result["class"] in FINDINGS or ratio > 2.0:
                print(f"{result['class']}: {case.sample} {case.recipe!r}: {result['message'][-300:]}", file=sys.stderr)
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    target = args.keep / path.name
                    target.write_bytes(path.read_bytes())
                    target.with_suffix(".recipe").write_text(repr((case.sample, case.recipe)) + "\n")
            path.unlink()
        elapsed = time.monotonic() - started

    path_name = "ffai caption (whole path)" if args.cli else "probe + sample (forked child per file)"
    seeds = f"seeds {args.first_seed}..{args.first_seed + args.count - 1}"
    print(f"{args.count} files, {seeds}, {path_name}, {elapsed:.0f} s")
    for name in ("ok", "error", *FINDINGS):
        print(f"  {name:11} {classes[name]}")
    print(f"  worst peak RSS vs the unmutated sample: {worst_ratio:.2f}x ({worst_case})")
    print(f"  over 2x RSS {over_rss}")
    return 1 if any(classes[name] for name in FINDINGS) or worst_ratio > 2.0 else 0


if __name__ == "__main__":
    sys.exit(main())
