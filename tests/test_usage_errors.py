"""A command line the parser refuses: one `error:` line and one `hint:` line on stderr, exit 2."""

from __future__ import annotations

import pytest

from conftest import run_cli, run_tfm_process


@pytest.mark.parametrize("args, fragment", [
    (["translate", "-m", "m.safetensors", "--beam", "five"], "'--beam'"),
    (["translate", "--bogus"], "No such option: --bogus"),
    (["translate"], "Missing option '-m' / '--model'"),
    (["nope"], "No such command 'nope'"),
    (["tokenize", "encode", "-m"], "Option '-m' requires an argument"),
    (["train", "--run", "r", "--threads", "x"], "'--threads'"),
])
def test_a_usage_error_is_one_error_line_and_a_hint(args, fragment):
    result = run_cli(args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("error:") and fragment in lines[0]
    assert lines[1].startswith("hint: run 'tfm") and "--help" in lines[1]
    assert result.stdout == ""


def test_a_real_process_reports_usage_errors_the_same_way():
    result = run_tfm_process(["translate", "--beam", "five", "-m", "x"])
    assert result.returncode == 2
    stderr = result.stderr.decode()
    assert stderr.startswith("error: Invalid value for '-b' / '--beam'") and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 2


def test_help_and_version_still_exit_zero():
    assert run_cli(["translate", "--help"]).exit_code == 0
    assert run_cli(["--version"]).exit_code == 0


@pytest.mark.parametrize("args, command", [
    (["translate", "-m"], "tfm translate"),  # Click reports a missing option value without a context
    (["score", "-r", "ref.txt", "-m"], "tfm score"),
    (["tokenize", "encode", "-m"], "tfm tokenize"),
])
def test_the_hint_names_the_subcommand_whose_option_is_wrong(args, command):
    result = run_cli(args)
    assert result.exit_code == 2
    assert f"hint: run '{command} --help'" in result.stderr
