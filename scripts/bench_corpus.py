"""Caption a corpus locally and on Ray (``--ray local``): wall time, windows per second per
stage, and the driver's peak RSS for a small and a ten-times larger corpus.

    python scripts/bench_corpus.py                      # 20 clips, the demo model, every measurement
    python scripts/bench_corpus.py --arms local,core --json > corpus.json

The corpus: 20 generated clips of 10-20 s in four codecs and four sizes (``make_corpus``),
written once under ``--corpus``. Every arm runs in a fresh subprocess (``--child ARM``), the
whole run timed as a user would time the command: Ray's start and stop included. Arms:

- ``local``: ``ffai caption`` as on this machine (the corpus driver, ``LocalBackend``);
- ``core``: ``--ray local`` (``ffai.ray.backend``: decode tasks and engine actors, Ray Core);
  it also reports each stage's seconds and windows, summed over the actors, and the decode
  tasks' (``RayBackend.stage_rates``);
- ``data``: the same decode function and engine actor as a Ray Data pipeline (``from_items``
  → ``flat_map`` → ``map_batches`` with an actor pool → ``iter_rows``), the design the
  backend did not take, timed on the same corpus for the README's comparison.

Peak RSS is the driver process's own (``ru_maxrss``): the inputs' count must not grow it. The
RSS runs (``--rss-inputs``) use a short segment of each input so that 200 inputs stay quick.
Load on the machine changes every figure; compare arms within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (codec, container suffix, encoder options): several decoders, all in this PyAV build.
CODECS = (
    ("libx264", ".mp4", {}),
    ("mpeg4", ".mkv", {}),
    ("libvpx-vp9", ".webm", {"deadline": "realtime", "cpu-used": "8"}),
    ("mpeg2video", ".ts", {}),
)
SIZES = ((320, 240), (640, 360), (854, 480), (1280, 720))
CLIP_FPS = 25


def make_corpus(folder: Path, count: int = 20) -> list[Path]:
    """``count`` clips, 10 to 20 s long, codecs and sizes in turn; kept when already written."""
    from sample_media import make_clip

    folder.mkdir(parents=True, exist_ok=True)
    clips = []
    for i in range(count):
        codec, suffix, options = CODECS[i % len(CODECS)]
        size = SIZES[(i // len(CODECS)) % len(SIZES)]
        seconds = 10 + (10 * i) // max(1, count - 1)
        path = folder / f"clip{i:02}_{codec}_{size[0]}x{size[1]}_{seconds}s{suffix}"
        if not path.exists():
            partial = path.with_name(".part-" + path.name)
            make_clip(partial, seconds, fps=CLIP_FPS, size=size, codec=codec, options=options)
            partial.rename(path)
        clips.append(path)
    return clips


def many_inputs(clips: list[Path], folder: Path, count: int) -> list[Path]:
    """``count`` distinct paths (hard links to the clips, in turn): a corpus of any size at no cost."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        clip = clips[i % len(clips)]
        path = folder / f"in{i:04}{clip.suffix}"
        if not path.exists():
            os.link(clip, path)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------- children


class _Measured:
    """The Ray backend, its stage rates read just before it closes."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.rates: dict = {}

    def __enter__(self):
        started = time.perf_counter()
        self.backend.__enter__()
        self.rates["startup_s"] = round(time.perf_counter() - started, 3)  # Ray up, first actor loaded
        return self

    def run(self, inputs):
        return self.backend.run(inputs)

    def __exit__(self, *exc) -> None:
        try:
            self.rates["stages"] = self.backend.stage_rates()
        finally:
            started = time.perf_counter()
            self.backend.__exit__(*exc)
            self.rates["shutdown_s"] = round(time.perf_counter() - started, 3)


def child(arm: str, inputs: list[str], out: Path, flags: dict, resources: dict) -> dict:
    from ffai import messages
    from ffai.run import jobs
    from ffai.run.options import CaptionOptions

    options = CaptionOptions(**flags)
    out.mkdir(parents=True, exist_ok=True)
    measured: list[_Measured] = []

    def ray_backend(run_options):
        from ffai.ray.backend import RayBackend, RayResources

        measured.append(_Measured(RayBackend(run_options, "local", RayResources(**resources))))
        return measured[-1]

    started = time.perf_counter()
    if arm == "data":
        windows = run_data(inputs, options)
        failed = 0
    else:
        with messages.collect() as said:  # the warnings stay unsaid, the errors are printed below
            failed = jobs.run_caption_jobs(
                inputs,
                str(out / "{stem}.srt"),
                None,
                options,
                overwrite=True,
                progress=False,
                make_backend=ray_backend if arm == "core" else None,
            )
        for message in said:
            if message.level == "error":
                print(f"error: {message.text}", file=sys.stderr)
        windows = None
    wall = time.perf_counter() - started
    return {
        "arm": arm,
        "inputs": len(inputs),
        "failed": failed,
        "wall_s": round(wall, 3),
        "driver_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "driver_cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 2),
        **(measured[0].rates if measured else {}),
        "windows": windows,
    }


def run_data(inputs: list[str], options) -> int:
    """The corpus through Ray Data, with the backend's own decode function and engine actor."""
    import logging

    import ray

    from ffai.ray.workers import EngineActor, Failed, decode_input
    from ffai.run.captioner import Captioner, available_cores
    from ffai.run.window_source import WindowItem

    captioner = Captioner(options)
    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, object_store_memory=1 << 30)
    ray.data.DataContext.get_current().enable_progress_bars = False
    cwd = os.getcwd()
    stages = list(captioner.engine.stages())
    model_dir = str(captioner.model_dir.absolute())

    def windows(row: dict) -> list[dict]:
        items = decode_input(row["source"], options, cwd)
        return [{"job": row["job"], "item": item} for item in items if isinstance(item, WindowItem)]

    class Engine:
        def __init__(self) -> None:
            # One actor, as the core arm plans on one machine: the cores' threads, two windows in flight.
            self.actor = EngineActor(stages, model_dir, options.runtime, available_cores(), 2)

        def __call__(self, batch: dict) -> dict:
            results = [self.actor.caption(item) for item in batch["item"]]
            return {"job": batch["job"], "text": [r.error if isinstance(r, Failed) else r.answer.text for r in results]}

    try:
        rows = ray.data.from_items([{"job": i, "source": s} for i, s in enumerate(inputs)])
        rows = rows.flat_map(windows, num_cpus=0.25)
        # 1.5 CPUs for the actor leave room for the decode tasks (0.25 each), or the pipeline hangs.
        rows = rows.map_batches(Engine, batch_size=1, concurrency=1, num_cpus=1.5, batch_format="numpy")
        count = sum(1 for _ in rows.iter_rows())
    finally:
        ray.shutdown()
    return count


# ---------------------------------------------------------------------------- parent


def run_child(arm: str, inputs: list[Path], out: Path, flags: dict, resources: dict) -> dict:
    spec = {"arm": arm, "inputs": [str(p) for p in inputs], "out": str(out), "flags": flags, "resources": resources}
    spec = json.dumps(spec)
    done = subprocess.run(
        [sys.executable, __file__, "--child", spec], capture_output=True, text=True, cwd=ROOT, timeout=3600
    )
    if done.returncode != 0:
        raise SystemExit(f"{arm} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_tracks(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.srt"))
    return names == sorted(p.name for p in b.glob("*.srt")) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / ".cache" / "bench-corpus")
    parser.add_argument("--arms", default="local,core,data")
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=6)
    parser.add_argument("--ray-actors", type=int, help="as ffai caption's flag (default: derived)")
    parser.add_argument("--ray-cpus-per-actor", type=float, help="as ffai caption's flag (default: derived)")
    parser.add_argument("--rss-inputs", default="20,200", help="corpus sizes for the driver's peak RSS ('' to skip)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        result = child(spec["arm"], spec["inputs"], Path(spec["out"]), spec["flags"], spec["resources"])
        print(json.dumps(result))
        return

    clips = make_corpus(args.corpus / "clips")
    flags = {"fps": args.fps, "window": args.window}
    resources = {"actors": args.ray_actors, "cpus_per_actor": args.ray_cpus_per_actor}
    report: dict = {"load_start": os.getloadavg(), "flags": flags, "resources": resources, "arms": {}}
    report["clips"] = [p.name for p in clips]
    for arm in [a for a in args.arms.split(",") if a]:
        result = run_child(arm, clips, args.corpus / "out" / arm, flags, resources)
        report["arms"][arm] = result
        print(f"{arm}: {result['wall_s']:.1f} s, driver peak RSS {result['driver_peak_rss_mib']} MiB", file=sys.stderr)
    arms = report["arms"]
    if "local" in arms and "core" in arms:
        report["core_over_local"] = round(arms["core"]["wall_s"] / arms["local"]["wall_s"], 3)
        report["identical_tracks"] = same_tracks(args.corpus / "out" / "local", args.corpus / "out" / "core")
    if "core" in arms:
        stages = arms["core"]["stages"]
        core = arms["core"]
        steady = core["wall_s"] - core["startup_s"] - core["shutdown_s"]
        if "local" in arms:
            report["core_over_local_after_startup"] = round(steady / arms["local"]["wall_s"], 3)
        report["windows_per_s"] = {
            name: round(calls / seconds, 2) if seconds else None for name, (seconds, calls) in stages.items()
        }
    # The RSS runs: one second of each input, one window each, so 200 inputs stay quick.
    short = {"fps": 1.0, "window": 1, "duration": 1.0}
    for n in [int(x) for x in args.rss_inputs.split(",") if x]:
        inputs = many_inputs(clips, args.corpus / f"inputs{n}", n)
        result = run_child("core", inputs, args.corpus / "out" / f"rss{n}", short, resources)
        report.setdefault("rss", {})[n] = result
        print(f"core, {n} inputs: driver peak RSS {result['driver_peak_rss_mib']} MiB", file=sys.stderr)
    if len(report.get("rss", {})) == 2:
        small, large = sorted(report["rss"])
        report["rss_ratio"] = round(
            report["rss"][large]["driver_peak_rss_mib"] / report["rss"][small]["driver_peak_rss_mib"], 3
        )
    report["load_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        summary = {k: v for k, v in report.items() if k not in ("arms", "rss", "clips")}
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
