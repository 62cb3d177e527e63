"""`tfm cache list|clean`: superseded entries go, entries a process reads stay, folders tfm did not make are
never touched. The readers are real processes (POSIX locks never conflict within one process); the
commands run in-process, after this process has dropped the entries it mapped."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from conftest import run_cli
from test_corpus_cache import SOURCE, TARGET, folders, prepare, write_pair

from tfm_cli.tokenization.tokenizer import Tokenizer

READER = """
import sys
from pathlib import Path
from tfm_cli.corpus.entry import open_entry
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
    cleaned = run_cli(["cache", "clean", cache, "--all"])
    assert cleaned.exit_code == 0, cleaned.stderr
    refs = [line for line in cleaned.stdout.splitlines() if line.endswith(".ref")]
    assert len(refs) == 2  # the refs that named them
    assert sorted(dry.stdout.splitlines()) == sorted(cleaned.stdout.splitlines())  # the dry run said so
    assert folders(cache) == ["my-notes"]


def test_a_users_ref_file_survives_clean_all(tmp_path):
    """The reproduction of issue 71: a user's notes.ref in the cache folder was removed as a stale ref."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "notes.ref").write_text("my notes\n")
    result = run_cli(["cache", "clean", cache, "--all"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert (cache / "notes.ref").read_text() == "my notes\n"
    assert f"not tfm's, left alone: {cache / 'notes.ref'}" in result.stderr
    assert "0 stale refs" in result.stderr


DEAD_PREPARER = """
import os, sys
from pathlib import Path
from tfm_cli.corpus.cache_folder import EntryNames, temp_folder
with temp_folder(EntryNames(Path(sys.argv[1]), sys.argv[2])) as temp:
    (temp / "src.tokens").write_bytes(b"half")
    os._exit(0)  # dies before its cleanup, as a killed preparation does
"""


def users_look_alikes(cache, family):
    """Files and folders a user or another tool could have in a cache folder, with tfm's suffixes, prefixes
    and manifest keys, none of them made by tfm: name -> what it is."""
    made = {
        "notes.ref": "a user's file named *.ref",
        f"{family}.0123456789abcdef.ref": "a ref's name, holding the user's text",
        f"{family}.fedcba9876543210.ref": "a ref's name, naming an entry of another family",
        ".tmp-photos": "a user's .tmp- folder",
        f".tmp-{family}-abc123": "a temp folder's name, another tool's marker",
        f".tmp-{family}-def456": "a temp folder's name, a marker naming another family's lock",
        "other-tool": "another tool's folder: manifest.json with an integer version and inputs",
        f"{family}-0123456789abcdef": "an entry's name and readers.lock, a manifest whose SHA-256s give another name",
    }
    (cache / "notes.ref").write_text("my notes\n")
    (cache / f"{family}.0123456789abcdef.ref").write_text("remember the milk\n")
    (cache / f"{family}.fedcba9876543210.ref").write_text("valid-0123456789ab-0123456789abcdef\n")
    for name, marker in [(".tmp-photos", None), (f".tmp-{family}-abc123", {"tool": "other", "lock": f"{family}.lock"}),
                         (f".tmp-{family}-def456", {"tool": "tfm", "lock": "valid-0123456789ab.lock"})]:
        (cache / name).mkdir()
        (cache / name / "holiday.txt").write_text("keep me")
        if marker is not None:
            (cache / name / "tfm-temp.json").write_text(json.dumps(marker))
    foreign_manifest = {"version": 4, "inputs": [{"src": {"path": "a", "sha256": "0" * 64},
                                                   "tgt": {"path": "b", "sha256": "1" * 64}}]}
    for name in ["other-tool", f"{family}-0123456789abcdef"]:
        (cache / name).mkdir()
        (cache / name / "manifest.json").write_text(json.dumps(foreign_manifest))
        (cache / name / "readers.lock").touch()
        (cache / name / "data.bin").write_bytes(b"keep me")
    return made


def test_clean_all_removes_only_what_tfm_provably_made(tmp_path, small_spm):
    cache = tmp_path / "cache"
    old, new = two_entries(tmp_path, small_spm)
    family = new.name.rsplit("-", 1)[0]
    dead = subprocess.run([sys.executable, "-c", DEAD_PREPARER, str(cache), family], capture_output=True, text=True)
    assert dead.returncode == 0, dead.stderr
    dead_temp = [path for path in cache.iterdir() if path.name.startswith(f".tmp-{family}-") and path.is_dir()]
    assert len(dead_temp) == 1
    stale_ref = cache / f"{family}.00000000deadbeef.ref"  # tfm's ref whose entry is gone
    stale_ref.write_text(f"{family}-00000000deadbeef")
    # An entry written before manifests said "tool": still tfm's, proven by its name and recorded SHA-256s.
    manifest = json.loads((new / "manifest.json").read_text())
    manifest.pop("tool", None)
    (new / "manifest.json").write_text(json.dumps(manifest))
    made = users_look_alikes(cache, family)

    listed = run_cli(["cache", "list", cache])
    assert listed.exit_code == 0, listed.stderr
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == sorted([old.name, new.name])
    cleaned = run_cli(["cache", "clean", cache, "--all"])
    assert cleaned.exit_code == 0, cleaned.stderr
    removed = set(cleaned.stdout.splitlines())
    assert {str(old), str(new), str(dead_temp[0]), str(stale_ref)} <= removed
    assert not any(str(cache / name) in removed for name in made)
    for name, what in made.items():
        assert (cache / name).exists(), f"{what} was removed"
        assert f"not tfm's, left alone: {cache / name}" in cleaned.stderr, what
    for name in [".tmp-photos", f".tmp-{family}-abc123", f".tmp-{family}-def456"]:
        assert (cache / name / "holiday.txt").read_text() == "keep me"
    assert (cache / "other-tool" / "data.bin").read_bytes() == b"keep me"
    assert (cache / "notes.ref").read_text() == "my notes\n"
    assert sorted(folders(cache)) == sorted(name for name in made if (cache / name).is_dir())
    assert not list(cache.glob("*.ref")) or all(path.name in made for path in cache.glob("*.ref"))


def test_a_missing_cache_folder_is_one_line(tmp_path):
    result = run_cli(["cache", "list", tmp_path / "nowhere"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "no such folder" in result.stderr


def test_a_file_given_as_the_cache_folder_is_one_line_and_stays(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    for command in (["cache", "list", path], ["cache", "clean", path, "--all"]):
        result = run_cli(command)
        assert result.exit_code == 1
        assert result.stderr.count("\n") == 1 and "not a folder" in result.stderr and "Traceback" not in result.stderr
    assert path.read_text() == "mine"


def test_cache_commands_do_not_import_torch(tmp_path):
    code = ("import sys; from tfm_cli.cli import main; sys.argv = ['tfm', 'cache', 'clean', sys.argv[1]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules")
    (tmp_path / "cache").mkdir()
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], capture_output=True)
    assert result.returncode == 0, result.stderr
