"""The contact sheet's footprint: caption a 60 s and a 600 s generated clip to ``-f html`` with
the same settings through `ffai caption`, and print for each the peak RSS of the whole process
tree, the page's size and its bytes per cue, then the RSS ratio (target <= 1.10: thumbnails,
not frames, are what a run keeps) and the page size a 10-minute clip gives.

    python scripts/bench_sheet.py [--model DIR] [--fps 2] [--window 8] [--size 320x240]

Without --model it uses the tiny random-weight test checkpoint (written on first use): the
footprint is the pipeline's and the page's, not the weights' values. A generated clip is
simpler than real footage and compresses better; the page's bound for any picture is
``tests/test_sheet.py::test_page_size_for_ten_minutes_at_fps_2_window_8_stays_a_few_mb``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ffai.bench.sample_media import make_clip
from ffai.rss import run_measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder (default: the tiny test checkpoint)")
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--size", default="320x240")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--seconds", type=float, nargs=2, default=(60.0, 600.0))
    args = parser.parse_args()
    if args.model is None:
        from ffai.bench import checkpoints

        args.model = str(checkpoints.checkpoint("tiny"))
    width, height = (int(v) for v in args.size.split("x"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seconds in args.seconds:
            clip = make_clip(Path(tmp) / f"clip{seconds:.0f}.mp4", seconds, fps=25, size=(width, height))
            out = Path(tmp) / f"clip{seconds:.0f}.html"
            cmd = [
                sys.executable,
                "-m",
                "ffai",
                "caption",
                "-i",
                str(clip),
                "--model",
                args.model,
                "--fps",
                str(args.fps),
                "--window",
                str(args.window),
                "--max-new-tokens",
                str(args.max_new_tokens),
                "-o",
                str(out),
                "--no-progress",
            ]
            proc, peak, elapsed = run_measured(cmd)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            page = out.read_bytes()
            cues = page.count(b'<article class="cue"')
            empty = page.index(b'<main id="cues">')  # the header, style and script: paid once
            per_cue = (len(page) - empty) / max(cues, 1)
            results.append((seconds, peak))
            print(
                f"{seconds:6.0f} s clip: {cues:4d} cues, peak RSS {peak / 2**20:7.1f} MiB (process tree), "
                f"page {len(page) / 1e6:6.2f} MB ({per_cue:7.0f} bytes per cue), {elapsed:6.1f} s"
            )
    ratio = results[1][1] / results[0][1]
    print(f"peak RSS ratio {args.seconds[1]:.0f} s / {args.seconds[0]:.0f} s: {ratio:.3f} (target <= 1.10)")
    return 0 if ratio <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
