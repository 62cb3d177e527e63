"""symmetrization.py against hand-computed cases of intersection, union, grow-diag-final-and and voting.

Each case lists the forward (src->tgt) pairs and the reverse model's pairs already in (src, tgt)
order; the expected grow-diag-final-and was worked out by hand from Koehn's definition.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tfm_cli.inference.symmetrization import SYMMETRIZATIONS, grow_diag_final_and, intersection, union, voted


def test_intersection_and_union_are_sorted_by_target_then_source():
    forward = [(2, 0), (0, 1), (1, 1)]
    backward = [(0, 1), (2, 0), (3, 2)]
    assert intersection(forward, backward) == [(2, 0), (0, 1)]
    assert union(forward, backward) == [(2, 0), (0, 1), (1, 1), (3, 2)]


@pytest.mark.parametrize(
    "forward, backward, expected",
    [
        # Both agree: nothing to grow.
        ([(0, 0), (1, 1)], [(0, 0), (1, 1)], [(0, 0), (1, 1)]),
        # (1, 2) neighbours (1, 1) and its target word is unaligned: grown. (2, 2) is the diagonal
        # neighbour of (1, 1) with an unaligned source word: grown too.
        ([(0, 0), (1, 1), (1, 2)], [(0, 0), (1, 1), (2, 2)], [(0, 0), (1, 1), (1, 2), (2, 2)]),
        # (0, 1) neighbours (0, 0) but both its words are already aligned: never added.
        ([(0, 0), (1, 1), (0, 1)], [(0, 0), (1, 1)], [(0, 0), (1, 1)]),
        # (3, 3) is no neighbour of anything aligned; final-and adds it: both words unaligned.
        ([(0, 0), (3, 3)], [(0, 0)], [(0, 0), (3, 3)]),
        # (0, 3): no neighbour, and its source word 0 is aligned, so final-AND refuses it.
        ([(0, 0), (0, 3)], [(0, 0)], [(0, 0)]),
        # Empty intersection: final-and takes the forward point, then the backward one (its two
        # words are still unaligned after the first).
        ([(0, 1)], [(1, 0)], [(1, 0), (0, 1)]),
        # ... but a backward point sharing a word with an added forward point is refused.
        ([(0, 1)], [(0, 0)], [(0, 1)]),
        # Growth chains within one pass: (1, 1) grows from (0, 0), then (2, 2) from (1, 1).
        ([(0, 0), (1, 1), (2, 2)], [(0, 0)], [(0, 0), (1, 1), (2, 2)]),
        # Growing only through union points: (1, 0) is in neither direction.
        ([(0, 0), (2, 1)], [(0, 0), (2, 1)], [(0, 0), (2, 1)]),
        ([], [], []),
    ],
)
def test_grow_diag_final_and_on_hand_computed_cases(forward, backward, expected):
    assert grow_diag_final_and(forward, backward) == expected


def test_grow_diag_final_and_lies_between_intersection_and_union():
    forward = [(0, 0), (1, 2), (2, 1), (3, 3), (4, 3), (0, 4)]
    backward = [(0, 0), (1, 1), (2, 1), (3, 3), (4, 4), (3, 4)]
    grown = set(grow_diag_final_and(forward, backward))
    assert set(intersection(forward, backward)) <= grown <= set(union(forward, backward))
    # Worked by hand: intersection {0-0, 2-1, 3-3}. In grid order, 0-0 grows its diagonal 1-1
    # (source word 1 unaligned), then 1-1 grows 1-2 (target word 2 unaligned). 3-3 grows 4-3
    # (source word 4) and then 3-4 (target word 4): side neighbours come before diagonals. By
    # then 4-4 and 0-4 have both words aligned, and final-and adds nothing.
    assert grown == {(0, 0), (2, 1), (3, 3), (1, 1), (1, 2), (4, 3), (3, 4)}


def test_every_symmetrization_is_listed_by_its_cli_name():
    assert set(SYMMETRIZATIONS) == {"intersection", "union", "grow-diag-final-and"}


def test_voted_keeps_the_pairs_enough_alignments_agree_on():
    runs = [[(0, 0), (1, 1), (2, 1)], [(0, 0), (1, 1), (1, 1)], [(0, 0), (2, 2)], [(3, 0)]]
    assert voted(runs, 1) == [(0, 0), (3, 0), (1, 1), (2, 1), (2, 2)]  # the union, by (tgt, src)
    assert voted(runs, 2) == [(0, 0), (1, 1)]  # a pair twice in one run is one vote
    assert voted(runs, 3) == [(0, 0)]
    assert voted(runs, 4) == []
    assert voted([], 1) == []
    # Two runs, both must agree: the intersection.
    assert voted(runs[:2], 2) == intersection(runs[0], runs[1])


def test_voted_needs_at_least_one_vote():
    with pytest.raises(ValueError, match="at_least must be 1 or more"):
        voted([[(0, 0)]], 0)


def run_symmetrize_script(arguments: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """recipes/alignment/symmetrize.py's main() in this process -> (exit code, stdout, stderr)."""
    script = Path(__file__).resolve().parents[1] / "recipes" / "alignment" / "symmetrize.py"
    spec = importlib.util.spec_from_file_location("recipe_symmetrize", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["symmetrize.py", *arguments])
    message = ""
    try:
        module.main()
        code = 0
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # sys.exit("...") : Python prints it on stderr and exits with 1
            code, message = 1, exit_.code + "\n"
        else:
            code = exit_.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err + message


def test_the_recipe_script_votes_over_runs_line_by_line(tmp_path, monkeypatch, capsys):
    # Three runs of two sentence pairs, forward and reverse files in (src, tgt) order.
    runs = [
        (["0-0 1-1 2-1", "0-0"], ["0-0 1-1", "0-0 1-1"]),  # intersections: {0-0, 1-1}, {0-0}
        (["0-0 1-1", "1-1"], ["0-0 1-1 2-2", "1-1"]),  # {0-0, 1-1}, {1-1}
        (["0-0 2-1", "0-0 1-1"], ["0-0 2-1", "0-0 1-1"]),  # {0-0, 2-1}, {0-0, 1-1}
    ]
    files = []
    for number, (forward, reverse) in enumerate(runs):
        for side, lines in (("fwd", forward), ("rev", reverse)):
            path = tmp_path / f"run{number}.{side}"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            files.append(str(path))
    code, out, _ = run_symmetrize_script([*files, "--method", "intersection", "--at-least", "2"], monkeypatch, capsys)
    assert (code, out) == (0, "0-0 1-1\n0-0 1-1\n")
    code, out, _ = run_symmetrize_script([*files, "--method", "intersection", "--at-least", "3"], monkeypatch, capsys)
    assert (code, out) == (0, "0-0\n\n")
    code, out, _ = run_symmetrize_script([*files, "--method", "intersection", "--at-least", "2", "--transpose"], monkeypatch, capsys)
    assert (code, out) == (0, "0-0 1-1\n0-0 1-1\n")
    code, out, _ = run_symmetrize_script(files[:2] + ["--method", "intersection"], monkeypatch, capsys)  # one run
    assert (code, out) == (0, "0-0 1-1\n0-0\n")


def test_the_recipe_script_refuses_unpaired_files_and_impossible_votes(tmp_path, monkeypatch, capsys):
    path = tmp_path / "links"
    path.write_text("0-0\n", encoding="utf-8")
    code, out, err = run_symmetrize_script([str(path)] * 3, monkeypatch, capsys)
    assert code == 2 and out == "" and "give a forward and a reverse file for each run (got 3 files" in err
    code, out, err = run_symmetrize_script([str(path)] * 2 + ["--at-least", "2"], monkeypatch, capsys)
    assert code == 2 and out == "" and "--at-least must be between 1 and the number of runs (1), not 2" in err
    longer = tmp_path / "longer"
    longer.write_text("0-0\n1-1\n", encoding="utf-8")
    code, out, err = run_symmetrize_script([str(path), str(longer)], monkeypatch, capsys)
    assert code == 1 and out == "0-0\n"
    assert "after line 1: the files differ in length" in err and "Traceback" not in err
