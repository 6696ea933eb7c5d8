"""Write every sample clip (scripts/sample_media.py) into a folder, one line per clip: name, path.

    python scripts/make_sample_media.py OUTDIR

The clips are the ones the tests write for themselves, gathered to look at or to try by hand.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sample_media import make_all


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path, help="folder to write the clips into")
    args = parser.parse_args(argv)
    for name, path in make_all(args.outdir).items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
