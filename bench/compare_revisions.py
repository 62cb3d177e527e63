"""Outputs at two git revisions: byte for byte, the same commands on the same models and sentences.

A refactoring must not change what tfm prints. Each revision is checked out into a temporary git
worktree; every command runs as a fresh `python -m tfm_cli` process with that worktree first on
PYTHONPATH (so it imports that revision's tfm_cli), and its stdout is compared between the two.
Commands: translate with the model's defaults, with --alignment, --constraints, --markup html and
--split-sentences; align; score -m; inspect-attention (pharaoh and json). Inputs are the first
--lines pairs of a parallel test set (Multi30k's test_2016_flickr by default), with constraints,
tags and paragraphs made from them by fixed rules (below). Prints a table and exits 1 if any
output differs.

Usage: python bench/compare_revisions.py --before REV [--after WORKTREE|REV] --model CKPT [--model CKPT ...]
       [--src FILE --tgt FILE] [--lines 200] [--threads 2]
--after defaults to the working tree as it is (uncommitted changes included).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
WORKTREE = "WORKTREE"  # --after: the working tree itself


@dataclass(frozen=True)
class Inputs:
    """The files the commands read, made once from the parallel test set."""

    src: Path
    tgt: Path
    constraints: Path  # source TAB a word of the reference
    markup: Path  # the source with its second word in <b>...</b> and an <a href> around the last
    paragraphs: Path  # pairs of source lines joined into one line
    few_src: Path  # the first 20 sources (inspect-attention)
    few_tgt: Path


def constraint_word(reference: str) -> str:
    """The longest word of the reference (the first of equal length), punctuation stripped: a phrase the
    translation can contain."""
    words = [word.strip(".,;:!?\"'()") for word in reference.split()]
    return max(words, key=len) if words else ""


def tagged(line: str) -> str:
    """`line` with inline tags around two of its words."""
    words = line.split()
    if len(words) >= 2:
        words[1] = f"<b>{words[1]}</b>"
    if len(words) >= 3:
        words[-1] = f'<a href="x?y=1&amp;z=2">{words[-1]}</a>'
    return " ".join(words)


def make_inputs(src: Path, tgt: Path, lines: int, folder: Path) -> Inputs:
    """Write the inputs of every command for the first `lines` pairs of `src` and `tgt` into `folder`."""
    sources = src.read_text(encoding="utf-8").splitlines()[:lines]
    targets = tgt.read_text(encoding="utf-8").splitlines()[:lines]
    files = {
        "src": sources,
        "tgt": targets,
        "constraints": [f"{s}\t{constraint_word(t)}" if constraint_word(t) else s for s, t in zip(sources, targets)],
        "markup": [tagged(s) for s in sources],
        "paragraphs": [" ".join(sources[i : i + 2]) for i in range(0, len(sources), 2)],
        "few_src": sources[:20],
        "few_tgt": targets[:20],
    }
    paths = {}
    for name, content in files.items():
        paths[name] = folder / f"{name}.txt"
        paths[name].write_text("".join(line + "\n" for line in content), encoding="utf-8")
    return Inputs(**paths)


def commands(model: Path, inputs: Inputs, threads: int) -> dict[str, list[str]]:
    """name -> tfm arguments, for one model."""
    common = ["-m", str(model), "--threads", str(threads), "--device", "cpu", "-q"]
    return {
        "translate": ["translate", *common, "-i", str(inputs.src)],
        "translate --alignment": ["translate", *common, "-i", str(inputs.src), "--alignment"],
        "translate --constraints": ["translate", *common, "-i", str(inputs.constraints), "--constraints"],
        "translate --markup html": ["translate", *common, "-i", str(inputs.markup), "--markup", "html"],
        "translate --split-sentences": ["translate", *common, "-i", str(inputs.paragraphs), "--split-sentences",
                                        "--source-lang", "de"],
        "align": ["align", *common, "--src", str(inputs.src), "--tgt", str(inputs.tgt)],
        "score -m": ["score", *common, "--src", str(inputs.src), "--tgt", str(inputs.tgt)],
        "inspect-attention pharaoh": ["inspect-attention", *common, "-i", str(inputs.few_src), "--target-file",
                                      str(inputs.few_tgt), "--words", "--format", "pharaoh"],
        "inspect-attention json": ["inspect-attention", *common, "-i", str(inputs.few_src), "--format", "json"],
    }


def run_tfm(code_root: Path, arguments: list[str]) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of `python -m tfm_cli ARGUMENTS` importing the tfm_cli of `code_root`."""
    environment = {**os.environ, "PYTHONPATH": str(code_root)}
    result = subprocess.run([sys.executable, "-m", "tfm_cli", *arguments], capture_output=True, env=environment,
                            cwd=code_root)
    return result.returncode, result.stdout, result.stderr


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def check_imports_from(code_root: Path) -> None:
    """Exit if `python -m tfm_cli` under PYTHONPATH=code_root would import another tree's tfm_cli."""
    probe = subprocess.run([sys.executable, "-c", "import tfm_cli; print(tfm_cli.__file__)"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(code_root)}, cwd=code_root, check=True)
    if not Path(probe.stdout.strip()).resolve().is_relative_to(code_root.resolve()):
        sys.exit(f"{code_root}: python imports tfm_cli from {probe.stdout.strip()}, not from this tree")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare against")
    parser.add_argument("--after", default=WORKTREE, help="a git revision, or WORKTREE (default): the working tree")
    parser.add_argument("--model", action="append", required=True, type=Path, help="a checkpoint (repeatable)")
    parser.add_argument("--src", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--tgt", type=Path, default=MULTI30K / "test_2016_flickr.en")
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="compare-revisions-") as temp:
        temp_dir = Path(temp)
        trees = {}
        for label, revision in (("before", args.before), ("after", args.after)):
            if revision == WORKTREE:
                trees[label] = REPO
                continue
            trees[label] = temp_dir / label
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[label]), revision], cwd=REPO, check=True)
        try:
            for tree in trees.values():
                check_imports_from(tree)
            inputs_dir = temp_dir / "inputs"
            inputs_dir.mkdir()
            inputs = make_inputs(args.src, args.tgt, args.lines, inputs_dir)
            rows, differing = [], 0
            for model in args.model:
                for name, arguments in commands(model.resolve(), inputs, args.threads).items():
                    before = run_tfm(trees["before"], arguments)
                    after = run_tfm(trees["after"], arguments)
                    same = before == after
                    differing += not same
                    label = f"{model.parent.name}/{model.name}"  # runs/NAME/average.safetensors: the run says which
                    rows.append((label, name, before[0], after[0], len(after[1]), digest(before[1]),
                                 digest(after[1]), "yes" if same else "NO"))
                    print(f"{label}  {name}: {'identical' if same else 'DIFFERENT'}", file=sys.stderr, flush=True)
        finally:
            for label, tree in trees.items():
                if tree != REPO:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
    print(f"before {args.before}, after {args.after}, {args.lines} lines of {args.src.name} / {args.tgt.name}, "
          f"{args.threads} threads")
    print("| model | command | exit before | exit after | stdout bytes | sha256 before | sha256 after | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print(f"{len(rows) - differing} of {len(rows)} outputs identical (stdout, stderr and exit code)")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
