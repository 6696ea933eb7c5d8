"""Exact-caption accuracy of the demo checkpoint on held-out synthetic scenes, through the engine
(the items and the scoring are ``ffai.bench.demo_eval``'s).

Usage: python scripts/eval_demo_model.py [--model models/smolvlm-demo] [--n 500] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ffai.bench import demo_eval

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "ffai" / "models" / "bundled" / "smolvlm-demo"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=demo_eval.DEFAULT_N)
    parser.add_argument("--seed", type=int, default=demo_eval.DEFAULT_SEED)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    result = demo_eval.evaluate(args.model, args.n, args.seed)
    for item, text in result.failures[:10]:
        print(
            f"  wrong ({item.kind}, {item.canvas[0]}x{item.canvas[1]}): expected {item.answer!r}, got {text.strip()!r}"
        )
    parts = ", ".join(f"{kind}s {c}/{t}" for kind, (c, t) in sorted(result.by_kind.items()))
    print(f"held-out exact-caption accuracy: {result.correct}/{result.total} = {100 * result.accuracy:.1f} % ({parts})")
    for group in demo_eval.GROUPS:
        correct, total = result.by_group.get(group, (0, 0))
        print(f"  {group}: {correct}/{total} = {100 * result.group_accuracy(group):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
