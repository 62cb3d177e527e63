"""What a cache folder of prepared corpora holds, and removing what is no longer needed (`tfm cache`).

No training run ever removes an entry (cache_folder.py): this module does, on request, and only entries
that no process reads (none holds a shared lock on their readers.lock), and only what tfm can prove it
made (cache_folder.tfm_entry_manifest, tfm_ref_target, temp_folder_lock): a cache folder is often a
folder the user keeps other files in. Library code: it never prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfm_cli.corpus.cache_folder import (
    CACHE_VERSION,
    MANIFEST,
    READERS_LOCK,
    REF_SUFFIX,
    TEMP_PREFIX,
    EntryNames,
    remove_dead_temp_folders,
    retire_folder,
    temp_folder_lock,
    tfm_entry_manifest,
    tfm_ref_target,
)
from tfm_cli.corpus.file_locks import try_lock
from tfm_cli.errors import TfmError

CURRENT, SUPERSEDED, OTHER_VERSION = "current", "superseded", "other version"


@dataclass(frozen=True)
class CacheEntry:
    """One prepared corpus in a cache folder."""

    path: Path
    state: str  # CURRENT (its text files unchanged), SUPERSEDED (changed or gone), OTHER_VERSION (another tfm's)
    in_use: bool  # a process reads it now (only known for entries of this version)
    size_bytes: int
    pairs: int | None
    files: tuple[str, ...]  # the text files it was prepared from


@dataclass
class CleanReport:
    """What clean_cache removed (or, dry, would remove) and what it kept because a process reads it."""

    entries: list[CacheEntry] = field(default_factory=list)
    temp_folders: list[Path] = field(default_factory=list)
    refs: list[Path] = field(default_factory=list)
    kept_in_use: list[CacheEntry] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)  # looked like tfm's, but tfm cannot prove it made them


def check_cache_folder(cache_dir: Path) -> None:
    """TfmError naming the problem if `cache_dir` is not an existing folder."""
    where = "give the cache folder (data.cache_dir, or RUN/cache)"
    if not cache_dir.exists():
        raise TfmError(f"{cache_dir}: no such folder; {where}")
    if not cache_dir.is_dir():
        raise TfmError(f"{cache_dir}: not a folder; {where}")


def foreign_items(cache_dir: Path) -> list[Path]:
    """The items of `cache_dir` with a name or content of tfm's kinds (a `.ref` file, a `.tmp-` folder, a
    folder holding a manifest.json) that tfm cannot prove it made, by name: they are never removed.
    Other files and folders (the user's own) are not listed."""
    found = []
    for path in sorted(cache_dir.iterdir()):
        if path.name.endswith(REF_SUFFIX):
            ours = tfm_ref_target(path) is not None
        elif path.name.startswith(TEMP_PREFIX) and path.is_dir():
            ours = temp_folder_lock(path) is not None
        elif path.is_dir() and (path / MANIFEST).exists():
            ours = tfm_entry_manifest(path) is not None
        else:
            continue
        if not ours:
            found.append(path)
    return found


def recorded_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The text files' records (path, size, mtime_ns, ...) of a manifest, src and tgt of each input in turn."""
    try:
        return [dict(pair[side]) for pair in manifest["inputs"] for side in ("src", "tgt")]
    except (KeyError, TypeError, ValueError):
        return []


def files_unchanged(records: list[dict[str, Any]]) -> bool:
    """Whether every recorded text file is still there with the recorded size and modification time."""
    if not records:
        return False
    for record in records:
        try:
            stat = os.stat(record["path"])
        except (OSError, KeyError, TypeError):
            return False
        if (stat.st_size, stat.st_mtime_ns) != (record.get("size"), record.get("mtime_ns")):
            return False
    return True


def entry_in_use(path: Path) -> bool:
    """Whether a process holds a shared lock on the entry's readers.lock (it maps the entry)."""
    fd = try_lock(path / READERS_LOCK)
    if fd is None:
        return True
    os.close(fd)
    return False


def folder_size(path: Path) -> int:
    """Bytes of the regular files directly in `path`."""
    return sum(item.stat().st_size for item in path.iterdir() if item.is_file() and not item.is_symlink())


def list_entries(cache_dir: Path) -> list[CacheEntry]:
    """The entries of `cache_dir` (folders tfm provably made), by name; TfmError if it is not a folder."""
    check_cache_folder(cache_dir)
    entries = []
    for path in sorted(cache_dir.iterdir()):
        manifest = tfm_entry_manifest(path)
        if manifest is None:
            continue
        records = recorded_files(manifest)
        if manifest["version"] != CACHE_VERSION:
            state, in_use = OTHER_VERSION, False
        else:
            state = CURRENT if files_unchanged(records) else SUPERSEDED
            in_use = entry_in_use(path)
        pairs = manifest.get("pairs")
        entries.append(CacheEntry(path, state, in_use, folder_size(path), pairs if isinstance(pairs, int) else None,
                                  tuple(str(record.get("path")) for record in records)))
    return entries


def clean_cache(cache_dir: Path, everything: bool = False, dry_run: bool = False) -> CleanReport:
    """Remove what `cache_dir` no longer needs; returns what was (with `dry_run`: would be) removed.

    Superseded entries (their text files changed or are gone), or with `everything` every entry, unless a
    process reads it; the temp folders of preparations that died; refs whose entry is gone (or, dry, would
    be). An entry leaves view at once (renamed into a marked temp folder) and is deleted after. Lock files
    stay: they are a few bytes, and removing one under a waiting process would let two preparers in.
    Only what tfm provably made is touched; `report.foreign` lists what looked like it but is not.
    """
    report = CleanReport()
    for entry in list_entries(cache_dir):
        if not (everything or entry.state == SUPERSEDED):
            continue
        if entry.in_use:
            report.kept_in_use.append(entry)
            continue
        if not dry_run and not remove_entry(entry.path):
            report.kept_in_use.append(entry)
            continue
        report.entries.append(entry)
    if not dry_run:
        report.temp_folders = remove_dead_temp_folders(cache_dir)
    removed = {entry.path.name for entry in report.entries}
    for ref in sorted(cache_dir.glob(f"*{REF_SUFFIX}")):
        target = tfm_ref_target(ref)
        if target is None:
            continue
        if target in removed or not (cache_dir / target).is_dir():
            if not dry_run:
                ref.unlink(missing_ok=True)
            report.refs.append(ref)
    report.foreign = foreign_items(cache_dir)
    return report


def remove_entry(path: Path) -> bool:
    """Remove the entry `path` unless a process reads it (checked under an exclusive lock on its
    readers.lock, held until it is out of view); returns whether it was removed."""
    fd = try_lock(path / READERS_LOCK)
    if fd is None:
        return False
    try:
        retire_folder(path, EntryNames(path.parent, path.name.rsplit("-", 1)[0]))
    finally:
        os.close(fd)
    return True
