"""Live-source latency: how long after a window's last frame is decoded its cue is on disk.

    python scripts/bench_live.py [--seconds 60] [--fps 2] [--window 4] [--cases demo,real] [--json]

A clip of the demo model's scenes (``scripts/live_stream.py``) is sent as MPEG-TS at real-time
pace into a named pipe, which ffai reads as a live source through the same library path as
``ffai caption -i PIPE -f jsonl -o FILE`` (a Captioner, a track written and fsynced per cue).
Per window: the wall time its last sample reached ffai (``Progress.on_frame``) and the time its
cue was written. Cases: ``demo``, the bundled demo model (target: p95 under one window's
duration); ``real``, the random-weight checkpoint with SmolVLM-256M's real shapes that
``ffai bench`` uses, which cannot keep up on a few cores: the share of windows dropped at the
default --max-lag, and the latency of those captioned (bounded by --max-lag plus the time of the
windows in flight).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from ffai.bench import demo_scenes
from ffai.kit import host
from ffai.outputs.cues import Cue, Dropped, TrackHeader
from ffai.outputs.tracks import open_track
from ffai.run.captioner import Captioner, Progress
from ffai.run.live import DEFAULT_MAX_LAG_S
from ffai.run.options import CaptionOptions
from live_stream import Pacer, encode_ts, paced_chunks


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def run_case(model: str, clip: bytes, fps: float, window: int, max_lag: float, in_flight: int, folder: Path) -> dict:
    fifo = folder / f"{Path(model).name}.ts"
    os.mkfifo(fifo)
    out = folder / f"{Path(model).name}.jsonl"
    options = CaptionOptions(model=model, fps=fps, window=window, max_lag=max_lag, max_in_flight=in_flight)
    arrived: dict[int, float] = {}  # sample time (ms) -> when it reached ffai
    latencies: list[float] = []
    cues = dropped = 0
    pacer = Pacer(paced_chunks(clip))

    def send() -> None:
        with open(fifo, "wb") as f:
            pacer.run(lambda data: (f.write(data), f.flush()))

    with Captioner(options) as captioner:  # the model loads before the source opens, as the CLI does
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        info = captioner.decoder.probe(str(fifo))
        header = TrackHeader(str(fifo), None, info.width, info.height, "smolvlm", model, fps, window, None, 64, None)
        writer = open_track(str(out), "jsonl", header, overwrite=True)
        progress = Progress(on_frame=lambda t: arrived.setdefault(round(t * 1000), time.monotonic()))
        for item in captioner.captions(info, progress):
            writer.write(item)
            if isinstance(item, Dropped):
                dropped += item.windows
                continue
            assert isinstance(item, Cue)
            cues += 1
            latencies.append(time.monotonic() - arrived[item.frame_times_ms[-1]])
        writer.close()
        sender.join()
    windows = cues + dropped
    return {
        "model": model,
        "stream_seconds": pacer.chunks[-1][0],
        "windows": windows,
        "captioned": cues,
        "dropped": dropped,
        "dropped_share": round(dropped / windows, 3) if windows else None,
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p95_s": round(percentile(latencies, 95), 3) if latencies else None,
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "window_seconds": window / fps,
        "max_lag_s": max_lag,
        "max_in_flight": in_flight,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the live stream")
    parser.add_argument("--fps", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--max-lag", type=float, default=DEFAULT_MAX_LAG_S)
    parser.add_argument("--max-in-flight", type=int, default=CaptionOptions.max_in_flight)
    parser.add_argument("--cases", default="demo,real")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = parser.parse_args()
    per_scene = 3.0
    scenes = [demo_scenes.CLIP_SCENES[i % len(demo_scenes.CLIP_SCENES)] for i in range(round(args.seconds / per_scene))]
    clip = encode_ts(scenes, per_scene)
    record = {"cpu": host.cpu_info().describe(), "cores": len(os.sched_getaffinity(0)), "load_before": os.getloadavg()}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            if case == "demo":
                model = "smolvlm-demo"
            elif case == "real":
                from ffai.bench import checkpoints

                model = str(checkpoints.checkpoint("real"))
            else:
                parser.error(f"unknown case {case!r} (demo, real)")
            result = {
                "case": case,
                **run_case(model, clip, args.fps, args.window, args.max_lag, args.max_in_flight, Path(tmp)),
            }
            results.append(result)
            if not args.json:
                print(json.dumps(result), flush=True)
    record["load_after"] = os.getloadavg()
    record["results"] = results
    print(
        json.dumps(record, indent=2) if args.json else json.dumps({k: v for k, v in record.items() if k != "results"})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
