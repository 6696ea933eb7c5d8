"""What one model costs through ffai, for docs/models.md's table: the bench's frame, an 8-frame
window at --fps 2 (a 4 s window), and its 2048x1536 still, each with 1 forced new token (the
picture's own cost: vision and prefill), and the frame with 33 (the 32 more give the cost of a
token of output). One model per process, so its peak RSS is its own.

    python scripts/model_costs.py smolvlm .cache/checkpoints/smolvlm-v2-256m-*
    flock /tmp/ffai-bigmem.lock python scripts/model_costs.py qwen3-vl .cache/checkpoints/qwen3-vl-2b-* frame

Prints one JSON line per timed item as it finishes, then the summary (seconds; the load
average beside each, since a shared machine's load moves every figure).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from ffai.bench import cases
from ffai.run.inline import InlineEngine

WINDOW_FPS = 2.0


def load_average() -> list[float]:
    with open("/proc/loadavg", encoding="ascii") as f:
        return [float(x) for x in f.read().split()[:3]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine")
    parser.add_argument("model")
    parser.add_argument("items", nargs="?", default="frame,window,still", help="of frame,window,still")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    summary: dict = {"engine": args.engine, "model": args.model, "load_start": load_average()}
    start = time.perf_counter()
    model = InlineEngine.load(args.engine, args.model)
    summary["load_s"] = time.perf_counter() - start
    frame = cases.items("frame")[0]
    window = cases.items("window")[0]
    window = cases.Item("window", window.images, tuple(i / WINDOW_FPS for i in range(len(window.images))))
    still = cases.items("still")[0]

    def timed(item: cases.Item, tokens: int) -> float:
        start = time.perf_counter()
        answer = model(item.request(cases.decoding(tokens)))
        seconds = time.perf_counter() - start
        assert len(answer.token_ids) == tokens, len(answer.token_ids)
        print(json.dumps({"item": item.id, "tokens": tokens, "s": seconds, "load": load_average()}), flush=True)
        return seconds

    timed(frame, 2)  # warm-up: the first call pays one-off set-up
    wanted = args.items.split(",")
    if "frame" in wanted:
        summary["frame_1"], summary["frame_33"] = timed(frame, 1), timed(frame, 33)
        summary["per_token"] = (summary["frame_33"] - summary["frame_1"]) / 32
    if "window" in wanted:
        summary["window_1"] = timed(window, 1)
    if "still" in wanted:
        summary["still_1"] = timed(still, 1)
    summary["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary["load_end"] = load_average()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
