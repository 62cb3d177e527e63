"""A full or read-only disk: every command that writes files fails with one line and leaves nothing half-written.

The full disk is a small tmpfs mounted in a user and mount namespace of its own (`unshare -rm`), which
needs no privileges where the kernel allows unprivileged user namespaces. The command and a listing
of the folder run inside that namespace, since the mount ends with it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, letter_settings

PAGE = 4096


def small_disk_available() -> bool:
    """Whether `unshare -rm` can mount a tmpfs here (no unshare binary, or user namespaces switched off: no)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not small_disk_available(), reason="cannot mount a small tmpfs unprivileged (unshare -rm) on this machine"
)


def run_on_full_disk(size_bytes: int, folder: Path, args: list, options: str = "") -> tuple[int, str, list[str]]:
    """Run `tfm ARGS` with `folder` a fresh tmpfs of `size_bytes` (mount `options` added, e.g. "ro");
    returns (exit code, stderr, files left in it). Its stdout goes to stdout.txt beside `folder`."""
    folder.mkdir(exist_ok=True)
    command = " ".join(shlex.quote(str(arg)) for arg in [sys.executable, "-m", "tfm_cli", *args])
    mount_options = f"size={size_bytes}" + (f",{options}" if options else "")
    script = (
        f"mount -t tmpfs -o {mount_options} tmpfs {shlex.quote(str(folder))} || exit 99\n"
        f"{command} >{shlex.quote(str(folder.parent / 'stdout.txt'))}\nstatus=$?\n"
        f"cd {shlex.quote(str(folder))} && find . -type f | sort >&3\nexit $status"
    )
    process = subprocess.run(
        ["unshare", "-rm", "bash", "-c", f"exec 3>&1 1>/dev/null; {script}"],
        capture_output=True, timeout=300, cwd=REPO_ROOT,
    )
    left = [line.removeprefix("./") for line in process.stdout.decode().splitlines()]
    return process.returncode, process.stderr.decode(), left


def assert_one_disk_full_line(code: int, stderr: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 1, stderr
    assert len(errors) == 1 and "No space left on device" in errors[0], stderr
    assert "Traceback" not in stderr


def test_tokenize_train_never_leaves_a_model_without_its_vocab(tmp_path, synthetic, small_spm):
    # Room for the .model (same inputs, same bytes as small_spm's) but not for the .vocab as well.
    model_pages = -(-small_spm.stat().st_size // PAGE)
    code, stderr, left = run_on_full_disk(
        model_pages * PAGE, tmp_path / "disk",
        ["tokenize", "train", synthetic["train.src"], synthetic["train.tgt"], "-o", tmp_path / "disk" / "spm",
         "--vocab-size", "200", "-q"],
    )
    assert_one_disk_full_line(code, stderr)
    assert left == []  # neither file, and no temp file


def test_train_stops_with_one_line_and_no_temp_file(tmp_path, letters):
    code, stderr, left = run_on_full_disk(
        64 * 1024, tmp_path / "disk",
        ["train", REPO_ROOT / "recipes" / "tiny.toml", "--run", tmp_path / "disk" / "run", "--threads", "1", "-q",
         *letter_settings(letters, **{"train.max_steps": 4, "train.save_every": 2})],
    )
    assert_one_disk_full_line(code, stderr)
    assert not [name for name in left if name.endswith(".tmp")], left


def test_average_writes_nothing(tmp_path, random_checkpoint):
    code, stderr, left = run_on_full_disk(
        PAGE * 8, tmp_path / "disk", ["average", random_checkpoint, "-o", tmp_path / "disk" / "avg.safetensors", "-q"]
    )
    assert_one_disk_full_line(code, stderr)
    assert left == []


def test_translate_to_a_file_writes_nothing(tmp_path, random_checkpoint):
    source = tmp_path / "source.txt"
    source.write_text("".join(f"sentence {i} with some words\n" for i in range(3000)), encoding="utf-8")
    code, stderr, left = run_on_full_disk(
        PAGE, tmp_path / "disk",
        ["translate", "-m", random_checkpoint, "-i", source, "-o", tmp_path / "disk" / "out.txt", "-b", "1",
         "--max-len-a", "0", "--max-len-b", "8", "--threads", "1", "-q"],
    )
    assert_one_disk_full_line(code, stderr)
    assert left == []


def test_inspect_attention_png_on_a_full_disk_prints_nothing(tmp_path, random_checkpoint):
    pytest.importorskip("matplotlib")  # the test extra installs it
    # The folder check before the work passes (an empty probe file fits); the image itself does not.
    code, stderr, left = run_on_full_disk(
        PAGE, tmp_path / "disk",
        ["inspect-attention", "-m", random_checkpoint, "a b c d", "--target", "e f g", "--png",
         tmp_path / "disk" / "attention.png", "--threads", "1"],
    )
    assert code == 1 and "cannot write the image" in stderr and "No space left on device" in stderr, stderr
    assert "Traceback" not in stderr and left == []
    assert (tmp_path / "stdout.txt").read_text() == ""  # the heatmap was not printed


def test_a_read_only_folder_is_named_as_the_output_not_a_temp_file(tmp_path, small_spm):
    output = tmp_path / "disk" / "out.txt"
    code, stderr, left = run_on_full_disk(
        PAGE, tmp_path / "disk", ["tokenize", "encode", "-m", small_spm, "-i", small_spm.with_suffix(".vocab"),
                                  "-o", output], options="ro",
    )
    assert code == 1, stderr
    assert stderr.startswith(f"error: {output}: Read-only file system") and ".tmp" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and left == []
