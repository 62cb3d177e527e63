"""`tfm cache list|clean`: superseded entries go, entries a process reads stay, folders tfm did not make are
never touched. The readers are real processes (POSIX locks never conflict within one process); the
commands run in-process, after this process has dropped the entries it mapped."""

from __future__ import annotations

import gc
import subprocess
import sys

from conftest import run_cli
from test_corpus_cache import SOURCE, TARGET, folders, prepare, write_pair

from tfm_cli.tokenizer import Tokenizer

READER = """
import sys
from pathlib import Path
from tfm_cli.corpus_entry import open_entry
corpus = open_entry(Path(sys.argv[1]), (1 << 30, 1 << 30), False)
print("mapped" if corpus is not None else "refused", flush=True)
sys.stdin.read()
"""


def start_reader(entry):
    """A process that maps the entry (as a training run does) until its stdin closes."""
    process = subprocess.Popen([sys.executable, "-c", READER, str(entry)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "mapped\n"
    return process


def two_entries(tmp_path, small_spm):
    """An entry of a.src/a.tgt, then a.tgt changed and its new entry: (old path, new path)."""
    tokenizer = Tokenizer.from_file(small_spm)
    src, tgt = write_pair(tmp_path, "a", SOURCE, TARGET)
    old = prepare(tmp_path, tokenizer, [(src, tgt)]).path
    tgt.write_text("".join(line + "\n" for line in TARGET[:-1] + ["la arbo"]), encoding="utf-8")
    new = prepare(tmp_path, tokenizer, [(src, tgt)]).path
    gc.collect()  # this test process maps neither any more
    return old, new


def test_clean_removes_a_superseded_entry_only_once_no_process_reads_it(tmp_path, small_spm):
    cache = tmp_path / "cache"
    old, new = two_entries(tmp_path, small_spm)
    (cache / ".tmp-notes").mkdir()
    (cache / ".tmp-notes" / "plan.txt").write_text("mine")
    listed = run_cli(["cache", "list", cache])
    assert listed.exit_code == 0, listed.stderr
    states = {line.split("\t")[0]: line.split("\t")[1:3] for line in listed.stdout.splitlines()}
    assert states == {old.name: ["superseded", "no"], new.name: ["current", "no"]}

    reader = start_reader(old)
    try:
        kept = run_cli(["cache", "clean", cache])
        assert kept.exit_code == 0, kept.stderr
        assert kept.stdout == ""
        assert f"kept {old.name}: a running process reads it" in kept.stderr
        assert old.is_dir()
    finally:
        reader.communicate("")
    cleaned = run_cli(["cache", "clean", cache])
    assert cleaned.exit_code == 0, cleaned.stderr
    removed = cleaned.stdout.splitlines()
    assert removed[0] == str(old) and len(removed) == 2 and removed[1].endswith(".ref")  # and the ref that named it
    assert folders(cache) == sorted([".tmp-notes", new.name])
    assert (cache / ".tmp-notes" / "plan.txt").read_text() == "mine"


def test_clean_all_removes_current_entries_too_but_never_foreign_folders(tmp_path, small_spm):
    cache = tmp_path / "cache"
    old, new = two_entries(tmp_path, small_spm)
    (cache / "my-notes").mkdir()
    dry = run_cli(["cache", "clean", cache, "--all", "--dry-run"])
    assert sorted(dry.stdout.splitlines()) == sorted([str(old), str(new)])
    assert folders(cache) == sorted([old.name, new.name, "my-notes"])
    cleaned = run_cli(["cache", "clean", cache, "--all"])
    assert cleaned.exit_code == 0, cleaned.stderr
    refs = [line for line in cleaned.stdout.splitlines() if line.endswith(".ref")]
    assert len(refs) == 2  # the refs that named them
    assert folders(cache) == ["my-notes"]


def test_a_missing_cache_folder_is_one_line(tmp_path):
    result = run_cli(["cache", "list", tmp_path / "nowhere"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "not a folder" in result.stderr


def test_cache_commands_do_not_import_torch(tmp_path):
    code = ("import sys; from tfm_cli.cli import main; sys.argv = ['tfm', 'cache', 'clean', sys.argv[1]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules")
    (tmp_path / "cache").mkdir()
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], capture_output=True)
    assert result.returncode == 0, result.stderr
