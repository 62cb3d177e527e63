"""Where output goes and input comes from: symlinks, devices, FIFOs, full disks, closed streams, pipes.

`-o` replaces a regular file atomically, follows a symbolic link to the file it names, and writes
devices and FIFOs in place (never renaming a file over them). A write error is one line and exit 1.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import run_cli

TEXT = "a b c\nd e\n"


def encode(args: list, input: str = TEXT):
    """`tfm tokenize encode -m SMALL_SPM ARGS` in-process."""
    return run_cli(["tokenize", "encode", *args], input=input)


def test_a_symlink_output_replaces_the_file_it_names_and_stays_a_link(tmp_path, small_spm):
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    result = encode(["-m", small_spm, "-o", link])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text().count("\n") == 2 and "old" not in real.read_text()


def test_a_fifo_output_is_written_in_place(tmp_path, small_spm):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = encode(["-m", small_spm, "-o", fifo])
    reader.join(timeout=60)
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # still the FIFO, not a regular file renamed over it
    assert received and received[0].count(b"\n") == 2


def test_a_device_output_is_written_in_place(tmp_path, small_spm):
    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    result = encode(["-m", small_spm, "-o", device])
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISCHR(device.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temp file left beside it


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_full_disk_is_one_error_line(small_spm):
    with open("/dev/full", "wb") as full:
        process = subprocess.run(
            [sys.executable, "-m", "tfm_cli", "tokenize", "encode", "-m", str(small_spm)],
            input=TEXT.encode(), stdout=full, stderr=subprocess.PIPE, timeout=120,
        )
    stderr = process.stderr.decode()
    assert process.returncode == 1
    assert stderr.startswith("error: ") and "No space left on device" in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_full_device_given_with_o_is_named_in_the_error(tmp_path, small_spm):
    source = tmp_path / "in.txt"
    source.write_text(TEXT)
    process = subprocess.run(
        [sys.executable, "-m", "tfm_cli", "tokenize", "encode", "-m", str(small_spm), "-i", str(source), "-o", "/dev/full"],
        capture_output=True, timeout=120,
    )
    stderr = process.stderr.decode()
    assert process.returncode == 1
    assert stderr.startswith("error: /dev/full: No space left on device"), stderr


@pytest.mark.parametrize("name", ["/dev/stdout", "/proc/self/fd/1"])
def test_o_dev_stdout_onto_a_file_goes_on_after_what_the_shell_wrote(tmp_path, small_spm, name):
    # The shell opened out.txt once for the whole group: tfm writes through that descriptor, after
    # "before", instead of replacing the file it leads to.
    source = tmp_path / "in.txt"
    source.write_text(TEXT)
    output = tmp_path / "out.txt"
    command = (
        f'{{ echo before; "{sys.executable}" -m tfm_cli tokenize encode -m "{small_spm}" -i "{source}" -o {name}; '
        f'echo after; }} > "{output}"'
    )
    process = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120)
    assert process.returncode == 0, process.stderr.decode()
    lines = output.read_text().splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert len(lines) == 2 + TEXT.count("\n")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


@pytest.mark.parametrize("redirect, message", [
    ("<&-", "error: stdin is closed; give the input file with -i FILE"),
    ('-i "{source}" >&-', "error: stdout is closed; give an output file with -o FILE"),
])
@pytest.mark.parametrize("tool", ['tokenize encode -m "{spm}"', 'translate -m "{model}" -b 1 --max-len-b 3'])
def test_a_closed_stream_is_one_error_line(tmp_path, small_spm, random_checkpoint, tool, redirect, message):
    source = tmp_path / "in.txt"
    source.write_text(TEXT)
    arguments = tool.format(spm=small_spm, model=random_checkpoint)
    command = f'"{sys.executable}" -m tfm_cli {arguments} ' + redirect.format(source=source)
    process = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120)
    stderr = process.stderr.decode()
    assert process.returncode == 1, stderr
    assert stderr.strip() == message


@pytest.mark.parametrize("command", ["tokenize encode -m {spm}", "translate -m {model} -b 1 --max-len-b 3 --progress"])
def test_a_process_substitution_is_valid_input(tmp_path, small_spm, random_checkpoint, command):
    # `-i <(cat FILE)` is a pipe: reading it ahead (to count lines for a progress bar) would eat the input.
    source = tmp_path / "in.txt"
    source.write_text(TEXT)
    args = command.format(spm=small_spm, model=random_checkpoint)
    process = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m tfm_cli {args} -i <(cat "{source}")'],
        capture_output=True, timeout=120,
    )
    assert process.returncode == 0, process.stderr.decode()
    assert process.stdout.decode().count("\n") == 2


def test_sigterm_during_translate_to_a_file_leaves_neither_output_nor_temp_file(tmp_path, random_checkpoint):
    import signal
    import time

    source = tmp_path / "source.txt"
    source.write_text("".join(f"sentence {i} with some words\n" for i in range(5000)), encoding="utf-8")
    output = tmp_path / "out.txt"
    process = subprocess.Popen(
        [sys.executable, "-m", "tfm_cli", "translate", "-m", str(random_checkpoint), "-i", str(source), "-o",
         str(output), "-b", "1", "--max-len-a", "0", "--max-len-b", "3", "--buffer-size", "16", "--threads", "1", "-q"],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out.txt.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)  # wait until the output is being written
        assert list(tmp_path.glob(".out.txt.*.tmp")), "translate never started writing"
        process.send_signal(signal.SIGTERM)
        stderr = process.communicate(timeout=120)[1].decode()
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 143, stderr  # 128 + SIGTERM, what a process supervisor expects
    assert stderr.strip().splitlines() == ["error: terminated (SIGTERM)"]
    assert [p.name for p in tmp_path.iterdir()] == ["source.txt"]  # no output, no temp file


@pytest.mark.parametrize("command", [
    "translate -m <(cat {model}) -b 1 --max-len-b 3 -i {source}",
    "score -m <(cat {model}) --src {source} --tgt {source} --json",
    "inspect-attention -m <(cat {model}) 'a b c' --target 'd e' --format pharaoh",
    "tokenize encode -m <(cat {model}) -i {source}",
    "average <(cat {model}) -o {folder}/average.safetensors",
])
def test_a_checkpoint_through_a_pipe_is_a_checkpoint(tmp_path, random_checkpoint, command):
    # safetensors reads by offsets: a pipe (`-m <(ssh host cat model)`) cannot be, so tfm copies it first.
    source = tmp_path / "in.txt"
    source.write_text(TEXT)
    args = command.format(model=random_checkpoint, source=source, folder=tmp_path)
    process = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m tfm_cli {args}'], capture_output=True, timeout=120,
    )
    assert process.returncode == 0, process.stderr.decode()
    assert "Traceback" not in process.stderr.decode()


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_short_write_to_stdout_is_an_error_even_unbuffered(tmp_path, small_spm, unbuffered):
    # A file-size limit (ulimit -f; Python ignores SIGXFSZ, so writes fail with EFBIG) reached inside
    # a line: unbuffered, Python's text layer would drop the rest of the line and exit 0.
    source = tmp_path / "in.txt"
    source.write_text("a " * 2500 + "\n")
    command = (f'ulimit -f 1; PYTHONUNBUFFERED={unbuffered} "{sys.executable}" -m tfm_cli tokenize encode '
               f'-m "{small_spm}" -i "{source}" > "{tmp_path / "out.txt"}"')
    process = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120)
    stderr = process.stderr.decode()
    assert process.returncode == 1, stderr
    assert stderr.strip() == "error: <stdout>: File too large; nothing more was written"


def test_translate_with_stdin_closed_is_one_error_line(random_checkpoint):
    command = f'"{sys.executable}" -m tfm_cli translate -m "{random_checkpoint}" -b 1 <&-'
    process = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120)
    assert process.returncode == 1
    assert process.stderr.decode().strip() == "error: stdin is closed; give the input file with -i FILE"


@pytest.mark.parametrize("command", [
    "tokenize encode -m {spm} -o {loop}", "tokenize encode -m {spm} -i {loop}", "average {model} -o {loop}",
])
def test_a_symbolic_link_loop_is_named(tmp_path, small_spm, random_checkpoint, command):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    args = command.format(spm=small_spm, model=random_checkpoint, loop=loop).split()
    result = run_cli(args, input="a b\n")
    assert result.exit_code == 1 and result.stderr.count("error:") == 1, result.stderr
    assert f"{loop}: a symbolic link" in result.stderr and "loop" in result.stderr


# -o through links to what is not a regular file: written in place, whatever the chain of links
# (/proc/self/fd/N names a pipe `pipe:[1234]`, which no path resolves to: no temp file can go beside it).
OUTPUT_COMMANDS = {
    "tokenize": "tokenize encode -m {spm} -o {output}",
    "translate": "translate -m {model} -b 1 --max-len-a 0 --max-len-b 3 -o {output}",
}


def run_with_output(command: str, output: Path, small_spm, random_checkpoint):
    args = OUTPUT_COMMANDS[command].format(spm=small_spm, model=random_checkpoint, output=output).split()
    return run_cli(args, input=TEXT)


def linked(tmp_path: Path, target: Path | str, links: int) -> Path:
    """A chain of `links` symbolic links ending at `target`; returns the first link."""
    for number in range(links, 0, -1):
        link = tmp_path / f"link{number}.txt"
        link.symlink_to(target)
        target = link
    return link


@pytest.mark.parametrize("links", [1, 2])
@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
def test_a_link_to_a_fifo_is_written_in_place(tmp_path, small_spm, random_checkpoint, command, links):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        result = run_with_output(command, linked(tmp_path, fifo, links), small_spm, random_checkpoint)
    finally:
        with contextlib.suppress(OSError):  # if tfm never opened the FIFO, the reader still waits for a writer
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
    assert result.exit_code == 0, result.stderr
    assert received and received[0].count(b"\n") == 2
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.fifo", *(f"link{n}.txt" for n in range(1, links + 1))])


@pytest.mark.parametrize("links", [1, 2])
@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
def test_a_link_to_dev_null_is_written_in_place(tmp_path, small_spm, random_checkpoint, command, links):
    result = run_with_output(command, linked(tmp_path, Path(os.devnull), links), small_spm, random_checkpoint)
    assert result.exit_code == 0, result.stderr
    assert all(p.is_symlink() for p in tmp_path.iterdir())  # no temp file, no file renamed over a link


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="no /proc/self/fd on this system")
@pytest.mark.parametrize("links", [0, 1, 2])
@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
def test_a_link_to_a_pipe_in_proc_self_fd_is_written_in_place(tmp_path, small_spm, random_checkpoint, command, links):
    read_end, write_end = os.pipe()
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(os.fdopen(read_end, "rb").read()), daemon=True)
    reader.start()
    try:
        fd_path = Path(f"/proc/self/fd/{write_end}")  # this process's own: run_cli runs tfm in-process
        result = run_with_output(command, linked(tmp_path, fd_path, links) if links else fd_path, small_spm,
                                 random_checkpoint)
    finally:
        os.close(write_end)
        reader.join()
    assert result.exit_code == 0, result.stderr
    assert received[0].count(b"\n") == 2
    assert all(p.is_symlink() for p in tmp_path.iterdir())


def test_a_link_to_proc_self_fd_1_writes_to_stdout(tmp_path, random_checkpoint):
    # What a process supervisor or a script does: -o names a link to the process's own stdout, a pipe.
    link = linked(tmp_path, "/proc/self/fd/1", 1)
    process = subprocess.run(
        [sys.executable, "-m", "tfm_cli", *OUTPUT_COMMANDS["translate"].format(model=random_checkpoint, output=link).split()],
        input=TEXT.encode(), capture_output=True, timeout=120,
    )
    assert process.returncode == 0, process.stderr.decode()
    assert process.stdout.decode().count("\n") == 2 and "error" not in process.stderr.decode()


def test_a_chain_of_links_to_a_regular_file_replaces_the_file_and_keeps_the_links(tmp_path, small_spm, random_checkpoint):
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    inode = real.stat().st_ino
    first = linked(tmp_path, real, 2)
    result = run_with_output("translate", first, small_spm, random_checkpoint)
    assert result.exit_code == 0, result.stderr
    assert os.readlink(first) == str(tmp_path / "link2.txt") and os.readlink(tmp_path / "link2.txt") == str(real)
    assert real.read_text().count("\n") == 2 and "old" not in real.read_text()
    assert real.stat().st_ino != inode  # replaced by a rename, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link1.txt", "link2.txt", "real.txt"]


def test_an_output_file_replaced_keeps_its_permissions(tmp_path, small_spm):
    private = tmp_path / "private.txt"
    private.write_text("old\n")
    private.chmod(0o600)
    result = encode(["-m", small_spm, "-o", private])
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and "old" not in private.read_text()
    shared = tmp_path / "shared.txt"
    shared.write_text("old\n")
    shared.chmod(0o664)
    assert encode(["-m", small_spm, "-o", shared]).exit_code == 0
    assert stat.S_IMODE(shared.stat().st_mode) == 0o664


def test_a_new_output_file_gets_the_umask_s_permissions(tmp_path, small_spm):
    old_umask = os.umask(0o027)
    try:
        result = encode(["-m", small_spm, "-o", tmp_path / "new.txt"])
    finally:
        os.umask(old_umask)
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640


def test_a_file_the_user_may_not_write_is_not_replaced(tmp_path, small_spm, monkeypatch):
    # Root may write any file, so a non-root user's view of a read-only file is simulated.
    locked = tmp_path / "locked.txt"
    locked.write_text("keep\n")
    locked.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == locked else real_access(path, mode, **kw))
    result = encode(["-m", small_spm, "-o", locked])
    assert result.exit_code == 1
    assert "no permission to write this file" in result.stderr and str(locked) in result.stderr
    assert locked.read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["locked.txt"]


def test_a_byte_order_mark_starting_the_input_is_dropped(small_spm):
    with_mark = run_cli(["tokenize", "encode", "-m", small_spm], input="\ufeffa b c\r\nd e\n")
    without = run_cli(["tokenize", "encode", "-m", small_spm], input="a b c\nd e\n")
    assert with_mark.exit_code == 0 and with_mark.stdout == without.stdout
    # Only a file's first character is a signature; elsewhere U+FEFF is text and stays.
    inside = run_cli(["tokenize", "encode", "-m", small_spm], input="a b c\n\ufeffd e\n")
    assert inside.stdout.splitlines()[1] != without.stdout.splitlines()[1]
