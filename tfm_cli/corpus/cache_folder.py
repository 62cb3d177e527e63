"""The layout of a folder of prepared corpora (cache.py), shared by runs that start together, by
containers and by hosts (NFS), and who may remove what in it. No torch here: `tfm cache` starts fast.

- entries, CACHE/NAME-FAMILY-CONTENT/: src.tokens and tgt.tokens (int32), src.offsets, tgt.offsets and
  lines (int64), manifest.json and readers.lock. FAMILY is a digest of the text files' paths, the
  tokenizers and the filter settings; CONTENT one of the files' full SHA-256. An entry is published
  whole (a temp folder renamed) and never changed after: a changed file gets a new entry, and no run
  removes one (`tfm cache clean` does, when no process reads it). Readers hold a shared lock on
  readers.lock while they map the entry.
- refs, CACHE/NAME-FAMILY.PRINT.ref: the name of the entry made from files whose fingerprints (size,
  modification and change times, inode, sampled blocks) digest to PRINT, so a run starts without
  reading the text. The full SHA-256 is checked all the same (cache.ContentCheck), and a
  mismatch removes the ref.
- locks, CACHE/NAME-FAMILY.lock: held by the one process preparing an entry of that family; the others
  wait for it, then use its entry. Lock files stay: removing one under a waiting process would let two
  preparers in.
- temp folders, CACHE/.tmp-NAME-FAMILY-RANDOM/, each with a marker file naming its family's lock: a
  temp folder is removed only when it has a marker and its lock can be taken (its preparer is dead).

A cache folder is often one the user also keeps files in, so tfm removes only what it can prove it made
(`tfm_entry_manifest`, `tfm_ref_target`, `temp_folder_lock`): a name of the shapes above, and content
that agrees with the name (a manifest whose recorded SHA-256s give the entry's name, or that says
`"tool": "tfm"`; a ref naming an entry of its own family; a temp folder's marker naming its own family's
lock). Anything else is not tfm's, whatever it is called.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfm_cli.corpus.file_locks import holder_record, try_lock
from tfm_cli.corpus.parallel_text import FileFingerprint

CACHE_VERSION = 4
MANIFEST = "manifest.json"
READERS_LOCK = "readers.lock"
TEMP_PREFIX = ".tmp-"
TEMP_MARKER = "tfm-temp.json"  # inside every temp folder tfm makes: {"tool": "tfm", "lock": NAME, host, pid, since}
REF_SUFFIX = ".ref"
LOCK_SUFFIX = ".lock"
TOOL = "tfm"  # the "tool" of every manifest and temp marker tfm writes

FAMILY = r"[a-z]+-[0-9a-f]{12}"  # NAME-FAMILY: the corpus's name (train, valid), then 12 hex digits
ENTRY_NAME = re.compile(rf"(?P<family>{FAMILY})-(?P<content>[0-9a-f]{{16}})")
REF_NAME = re.compile(rf"(?P<family>{FAMILY})\.[0-9a-f]{{16}}{re.escape(REF_SUFFIX)}")
TEMP_NAME = re.compile(rf"{re.escape(TEMP_PREFIX)}(?P<family>{FAMILY})-[A-Za-z0-9_]+")
MAX_REF_BYTES = 256  # a ref holds one entry name (46 bytes for "train-...")


def digest_of(parts: Any) -> str:
    """The hex SHA-256 of `parts` as canonical JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class EntryNames:
    """Where the pieces of one family live in a cache folder."""

    cache_dir: Path
    family: str  # NAME-FAMILY

    def entry(self, sha256s: list[str]) -> Path:
        """The entry of the text files whose full SHA-256s (src, tgt of each input in turn) are `sha256s`."""
        return self.cache_dir / f"{self.family}-{digest_of(sha256s)[:16]}"

    def ref(self, prints: list[tuple[FileFingerprint, FileFingerprint]]) -> Path:
        """The ref file for text files with these fingerprints."""
        key = digest_of([[src.to_dict(), tgt.to_dict()] for src, tgt in prints])
        return self.cache_dir / f"{self.family}.{key[:16]}{REF_SUFFIX}"

    @property
    def lock(self) -> Path:
        """The lock file held while an entry of this family is prepared."""
        return self.cache_dir / f"{self.family}{LOCK_SUFFIX}"

    def entries(self) -> list[Path]:
        """The published entries of this family, newest first."""
        found = [path for path in self.cache_dir.glob(f"{self.family}-*") if path.is_dir()]
        return sorted(found, key=lambda path: path.stat().st_mtime_ns, reverse=True)


def recorded_content_digest(manifest: dict[str, Any]) -> str | None:
    """The 16 hex digits an entry with this manifest is named by (its text files' recorded full SHA-256s,
    src and tgt of each input in turn, digested); None if the manifest does not record them."""
    try:
        sha256s = [str(pair[side]["sha256"]) for pair in manifest["inputs"] for side in ("src", "tgt")]
    except (KeyError, TypeError):
        return None
    return digest_of(sha256s)[:16] if sha256s else None


def tfm_entry_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of `path` if it is an entry folder tfm made (of any cache version), else None.

    Proof: an entry's name, its readers.lock, and a manifest (a JSON object with an integer version) that
    either says `"tool": "tfm"` or records the SHA-256s whose digest is the name's last part (entries of
    cache versions 3 and 4 written before the tool key). A folder of another tool, whatever its manifest
    holds, is not tfm's.
    """
    name = ENTRY_NAME.fullmatch(path.name)
    if name is None or path.is_symlink() or not path.is_dir() or not (path / READERS_LOCK).is_file():
        return None
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("version"), int) or "inputs" not in manifest:
        return None
    if manifest.get("tool") != TOOL and recorded_content_digest(manifest) != name["content"]:
        return None
    return manifest


def tfm_ref_target(path: Path) -> str | None:
    """The entry name that the ref file `path` holds if tfm wrote it, else None.

    Proof: a ref's name (NAME-FAMILY.PRINT.ref), a small regular file, and content that is the name of an
    entry of the same family. The entry itself need not exist (a stale ref).
    """
    name = REF_NAME.fullmatch(path.name)
    if name is None or path.is_symlink() or not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_REF_BYTES:
            return None
        target = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    entry = ENTRY_NAME.fullmatch(target)
    return target if entry is not None and entry["family"] == name["family"] else None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """An entry's manifest.json, or None if there is no entry or it is unreadable or of another version."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("version") != CACHE_VERSION:
        return None
    return manifest


@contextlib.contextmanager
def temp_folder(names: EntryNames) -> Iterator[Path]:
    """A new temp folder in the cache folder, marked as tfm's (with the family lock that its preparer holds),
    removed unless the caller renamed it into place. Its name is random: no other process can own it."""
    temp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{names.family}-", dir=names.cache_dir))
    try:
        marker = {"tool": TOOL, "lock": names.lock.name, **holder_record()}
        (temp / TEMP_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        yield temp
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def temp_folder_lock(path: Path) -> str | None:
    """The name of the lock file that the tfm temp folder `path` names in its marker; None if `path` is not
    a folder tfm made (not a temp folder's name, no marker, or a marker that is not tfm's or names another
    family's lock)."""
    name = TEMP_NAME.fullmatch(path.name)
    if name is None or path.is_symlink() or not path.is_dir():
        return None
    try:
        marker = json.loads((path / TEMP_MARKER).read_text(encoding="utf-8"))
        lock = marker["lock"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if marker.get("tool") != TOOL or lock != f"{name['family']}{LOCK_SUFFIX}":
        return None
    return lock


def remove_dead_temp_folders(cache_dir: Path, held_lock: str | None = None) -> list[Path]:
    """Remove the temp folders of preparations that died (killed, or their host gone); returns them.

    Only folders that tfm's marker names as its own are candidates, and each only when the lock its
    preparer held can be taken now (or is `held_lock`, the one this process holds): a preparation still
    running, on this host or any other sharing the folder, holds its lock. Folders without a marker
    are never touched, whatever their name.
    """
    removed = []
    if not cache_dir.is_dir():
        return removed
    for path in cache_dir.iterdir():
        lock = temp_folder_lock(path)
        if lock is None:
            continue
        if lock == held_lock:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            continue
        fd = try_lock(cache_dir / lock)  # never the held lock: closing a second descriptor would drop it
        if fd is None:
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def retire_folder(path: Path, names: EntryNames) -> None:
    """Remove the entry folder `path` from view at once (renamed to a marked temp folder), then delete it."""
    with temp_folder(names) as temp:
        with contextlib.suppress(FileNotFoundError):
            path.rename(temp / "retired")
