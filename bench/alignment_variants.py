"""Which attention of a model aligns best: AER of every decoder layer x (each head, mean of heads) x
(unshifted, shifted) on a gold standard, each computed by `tfm align` as a user runs it.

Prints a table sorted by AER (best first) and the `tfm align` flags of the best variant; with
--reverse-model, also the symmetrizations of the best variant applied to both directions. The rows
are the evidence for the default alignment settings a checkpoint carries (see bench/README.md).

Usage: python bench/alignment_variants.py -m MODEL --gold GOLD.talp --src gold.en --tgt gold.fr
           [--reverse-model REVERSE] [--layers 0,1,2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alignment_aer import aer, read_gold, read_pharaoh  # noqa: E402
from tfm_cli.checkpoints.format import read_checkpoint  # noqa: E402


def run_align(flags: list[str], output: Path) -> None:
    """Run `tfm align` with `flags`, writing Pharaoh lines to `output`; exits on failure."""
    command = [sys.executable, "-m", "tfm_cli", "align", *flags, "-o", str(output), "-q"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stderr}")


def variants(n_layers: int, n_heads: int, layers: list[int] | None) -> list[tuple[int, str, bool]]:
    """(layer, head ('mean' or a number), shift) for every layer asked (all by default)."""
    chosen = layers if layers is not None else list(range(n_layers))
    heads = ["mean"] + [str(h) for h in range(n_heads)]
    return [(layer, head, shift) for layer in chosen for head in heads for shift in (False, True)]


def variant_flags(layer: int, head: str, shift: bool) -> list[str]:
    """The `tfm align` flags selecting one variant."""
    return ["--align-layer", str(layer), "--align-head", head, "--align-shift" if shift else "--no-align-shift"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--reverse-model")
    parser.add_argument("--gold", required=True, type=Path)
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--layers", help="comma-separated decoder layers to try (default: all)")
    args = parser.parse_args()
    sure, possible = read_gold(args.gold)
    config = read_checkpoint(args.model).config
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "links"
        for layer, head, shift in variants(config.n_dec_layers, config.n_heads, layers):
            run_align(["-m", args.model, "--src", args.src, "--tgt", args.tgt, *variant_flags(layer, head, shift)], out)
            score = aer(read_pharaoh(out), sure, possible)
            rows.append((score.aer, layer, head, shift, score))
            print(f"layer {layer} head {head:>4} shift {str(shift):5}  AER {100 * score.aer:5.1f}", file=sys.stderr)
        rows.sort(key=lambda row: row[0])
        print(f"{'layer':>5} {'head':>5} {'shift':>5} {'AER %':>6} {'prec %':>7} {'rec %':>6} {'links':>6}")
        for _, layer, head, shift, score in rows:
            print(f"{layer:>5} {head:>5} {str(shift):>5} {100 * score.aer:6.1f} {100 * score.precision:7.1f} "
                  f"{100 * score.recall:6.1f} {score.links:>6}")
        _, layer, head, shift, _ = rows[0]
        print(f"best: tfm align {' '.join(variant_flags(layer, head, shift))}")
        if args.reverse_model:
            for method in ("intersection", "union", "grow-diag-final-and"):
                run_align(["-m", args.model, "--reverse-model", args.reverse_model, "--symmetrize", method,
                           "--src", args.src, "--tgt", args.tgt, *variant_flags(layer, head, shift)], out)
                score = aer(read_pharaoh(out), sure, possible)
                print(f"best variant, {method}: AER {100 * score.aer:.1f} (precision {100 * score.precision:.1f}, "
                      f"recall {100 * score.recall:.1f}, {score.links} links)")


if __name__ == "__main__":
    main()
