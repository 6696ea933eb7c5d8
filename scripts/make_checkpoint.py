"""Write a random-weight SmolVLM (Idefics3) checkpoint (ffai.engines.smolvlm.bench.checkpoints) into a folder.

    python scripts/make_checkpoint.py --config real|tiny --out DIR [--seed 0] [--dtype float32]

The tests and the bench write theirs into .cache/checkpoints/ themselves; this writes one
anywhere, e.g. to look at or to load elsewhere. Needs transformers (the [reference] extra); the real config and tokenizer files ship with the
package (ffai/engines/smolvlm/bench/files/smolvlm-256m-instruct).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ffai.engines.contract import TENSOR_DTYPES
from ffai.engines.smolvlm.bench import checkpoints
from ffai.errors import FfaiError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=checkpoints.WRITER.kinds, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=TENSOR_DTYPES, default="float32")
    args = parser.parse_args(argv)
    try:
        path = checkpoints.WRITER.write(args.config, args.out, seed=args.seed, dtype=args.dtype)
    except FfaiError as e:
        print(f"make_checkpoint: error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
