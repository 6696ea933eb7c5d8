"""Memory bounded by the window, not the clip: caption a 60 s and a 600 s generated clip with
the same settings through `ffai caption` and print the peak RSS of the whole process tree
(main process + pipeline workers) for each, and their ratio. Target: ratio <= 1.10.

    python scripts/bench_memory.py [--model DIR] [--fps 1] [--window 8] [--size 320x240] [--format srt|html]

With ``--format html`` (the contact sheet; ``--fps 2`` there is the issue's setting) it also
prints the page's size and its bytes per cue: thumbnails, not frames, are what a run keeps. A
generated clip compresses better than real footage; the page's bound for any picture is
``tests/test_sheet.py::test_page_size_for_ten_minutes_at_fps_2_window_8_stays_a_few_mb``.

Without --model it uses the tiny random-weight test checkpoint (written on first use):
memory boundedness is a property of the pipeline, not of the weights' values.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ffai.kit.host import run_measured
from sample_media import make_clip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder (default: the tiny test checkpoint)")
    parser.add_argument("--fps", type=float, default=1.0)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--size", default="320x240")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--seconds", type=float, nargs=2, default=(60.0, 600.0))
    parser.add_argument("--format", choices=("srt", "html"), default="srt")
    args = parser.parse_args()
    if args.model is None:
        from ffai.bench import checkpoints

        args.model = str(checkpoints.checkpoint("tiny"))
    width, height = (int(v) for v in args.size.split("x"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seconds in args.seconds:
            clip = make_clip(Path(tmp) / f"clip{seconds:.0f}.mp4", seconds, fps=25, size=(width, height))
            out = Path(tmp) / f"clip{seconds:.0f}.{args.format}"
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
            page = ""
            if args.format == "html":
                data = out.read_bytes()
                cues = data.count(b'<article class="cue"')
                per_cue = (len(data) - data.index(b'<main id="cues">')) / max(cues, 1)  # the header is paid once
                page = f", page {len(data) / 1e6:6.2f} MB ({per_cue:7.0f} bytes per cue)"
            else:
                cues = out.read_text().count(" --> ")
            results.append((seconds, peak, elapsed, cues))
            print(
                f"{seconds:6.0f} s clip: {cues:4d} cues, peak RSS {peak / 2**20:7.1f} MiB (process tree){page}, "
                f"{elapsed:6.1f} s"
            )
    ratio = results[1][1] / results[0][1]
    print(f"peak RSS ratio {args.seconds[1]:.0f} s / {args.seconds[0]:.0f} s: {ratio:.3f} (target <= 1.10)")
    return 0 if ratio <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
