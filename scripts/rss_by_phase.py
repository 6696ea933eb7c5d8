"""The resident memory of one bench arm by phase: ``import``, ``load`` (the weights) and ``run``
(one bench case), sampled every 50 ms over the arm's process tree as the bench samples it
(``ffai.kit.host.PeakRSS``), so a peak can be told apart from what a load leaves behind.

    python scripts/rss_by_phase.py MODEL_DIR --engine qwen3-vl --dtype int8 --case frame [--threads 2]

Prints one JSON object: each phase's peak, the RSS after the load and at the end, in MiB.
The bench (``ffai bench vlm``) reports only the whole process's peak.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--engine", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--case", default="frame", help="one of the bench's cases: frame, still, window, clip")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from ffai.kit.host import PeakRSS, tree_rss

    pid, peaks = os.getpid(), {}
    # The same sampler as the bench's, over this process and any workers it starts.
    with PeakRSS(pid) as sampler:  # the arm made: ffai, torch and the engine imported, no weights yet
        from ffai.bench import arms

        arm = arms.make_arm("ffai", args.model, args.dtype, args.threads, args.engine)
    peaks["import"] = sampler.peak
    with PeakRSS(pid) as sampler:
        arm.load()
    peaks["load"], after_load = sampler.peak, tree_rss(pid)
    with PeakRSS(pid) as sampler:
        arms.run_case(arm, args.case, None)
    peaks["run"] = sampler.peak
    result = {"peaks_mib": {k: v // MIB for k, v in peaks.items()}, "after_load_mib": after_load // MIB}
    print(json.dumps({**result, "end_mib": tree_rss(pid) // MIB}))
    arm.close()


if __name__ == "__main__":
    main()
