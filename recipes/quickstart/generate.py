"""Write the quickstart's synthetic corpus (train/valid/test .src/.tgt and their gold .align) into a folder.

Usage: python recipes/quickstart/generate.py OUT_DIR [--train N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tfm_cli.synthetic import write_corpus


def main() -> None:
    """Parse arguments, write the corpus, say on stderr what was written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--train", type=int, default=8000, help="training pairs")
    parser.add_argument("--valid", type=int, default=200, help="validation pairs")
    parser.add_argument("--test", type=int, default=500, help="held-out test pairs")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    paths = write_corpus(args.out_dir, args.train, args.valid, args.test, args.seed)
    print(f"wrote {len(paths)} files to {args.out_dir} ({args.train}/{args.valid}/{args.test} pairs)", file=sys.stderr)


if __name__ == "__main__":
    main()
