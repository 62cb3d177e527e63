"""The CLI shell: help without torch, version, unfinished commands refuse honestly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import run_cli
from tfm_cli import __version__

SUBCOMMANDS = ["tokenize", "train", "average", "translate", "score", "inspect-attention"]


def test_help_lists_every_subcommand_without_importing_torch():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from tfm_cli.cli import app\n"
        "result = CliRunner().invoke(app, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(result.stdout)\n"
        "assert 'torch' not in sys.modules, 'tfm --help imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for command in SUBCOMMANDS:
        assert command in result.stdout


def test_version():
    result = run_cli(["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"tfm {__version__}"


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help_with_examples(command):
    result = run_cli([command, "--help"])
    assert result.exit_code == 0, result.stderr
    assert "Usage" in result.stdout


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "tfm_cli", "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and __version__ in result.stdout


def test_a_finished_process_keeps_its_buffered_output_and_its_exit_status(random_checkpoint, tmp_path):
    # The process ends without Python's teardown (cli.end_process): whatever sits in stdout's buffer
    # (block-buffered into a pipe) must still arrive, and a user error must still exit 1.
    lines = "".join(f"Zeile {i}\n" for i in range(300))
    ok = subprocess.run([sys.executable, "-m", "tfm_cli", "translate", "-q", "-m", str(random_checkpoint), "-b", "1",
                         "--max-len-a", "0", "--max-len-b", "3"], input=lines, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("\n") == 300
    missing = subprocess.run([sys.executable, "-m", "tfm_cli", "translate", "-m", str(tmp_path / "none.safetensors")],
                             input="", capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and missing.stderr.startswith("error:")


def test_a_profiler_still_gets_its_results_at_exit(tmp_path):
    # cProfile writes its file at interpreter teardown, which end_process skips only when nothing traces.
    stats = tmp_path / "version.prof"
    result = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "tfm_cli", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert stats.is_file() and stats.stat().st_size > 0


@pytest.mark.parametrize("command", ["translate", "score", "inspect-attention"])
def test_unusable_device_is_one_clear_line(command, random_checkpoint, tmp_path):
    source = tmp_path / "src.txt"
    source.write_text("Ein Hund\n")
    args = {
        "translate": ["translate", "-m", random_checkpoint, "-i", source],
        "score": ["score", "-m", random_checkpoint, "--src", source, "--tgt", source],
        "inspect-attention": ["inspect-attention", "-m", random_checkpoint, "-i", source],
    }[command]
    result = run_cli([*args, "--device", "banana"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "--device banana: tfm runs on cpu or cuda" in result.stderr and "Traceback" not in result.stderr
