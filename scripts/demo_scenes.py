"""Rewrite the bundled demo clip from the synthetic scenes of ``ffai.bench.demo_scenes``.

python scripts/demo_scenes.py --clip examples/demo_clip.mp4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ffai.bench import demo_scenes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, required=True, help="write the demo clip here")
    args = parser.parse_args(argv)
    print(demo_scenes.make_demo_clip(args.clip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
