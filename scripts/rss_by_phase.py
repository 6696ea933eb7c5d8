"""The resident memory of one bench arm by phase: ``import``, ``load`` (the weights) and ``run``
(one bench case), sampled every 50 ms in the arm's own process, so a peak can be told apart from
what a load leaves behind.

    python scripts/rss_by_phase.py MODEL_DIR --engine qwen3-vl --dtype int8 --case frame [--threads 2]

Prints one JSON object: each phase's peak, the RSS after the load and at the end, in MiB.
The bench (``ffai bench vlm``) reports only the whole process's peak.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

MIB = 1 << 20


def rss_mib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 // MIB
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--engine", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--case", default="frame", help="one of the bench's cases: frame, still, window, clip")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    phase, peaks = ["import"], {}

    def sample() -> None:
        while True:
            peaks[phase[0]] = max(peaks.get(phase[0], 0), rss_mib())
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    from ffai.bench import arms

    arm = arms.make_arm("ffai", args.model, args.dtype, args.threads, args.engine)
    phase[0] = "load"
    arm.load()
    time.sleep(0.1)  # one more sample inside the phase
    after_load = rss_mib()
    phase[0] = "run"
    arms.run_case(arm, args.case, None)
    time.sleep(0.1)
    print(json.dumps({"peaks_mib": peaks, "after_load_mib": after_load, "end_mib": rss_mib()}))
    arm.close()


if __name__ == "__main__":
    main()
