"""Find or download the Multi30k English-German files; print the folder that holds them.

Usage: python recipes/multi30k/fetch.py
  - $MULTI30K_DIR set: checks that the six files are there and prints that folder (nothing is downloaded).
  - otherwise: downloads them once from the dataset's public repository (github.com/multi30k/dataset,
    data/task1/raw) into ${TFM_CACHE:-${XDG_CACHE_HOME:-~/.cache}/tfm}/multi30k and prints that folder.
Offline, or on any missing file, it prints one error line on stderr and exits 1; a file is only
written complete (downloaded to a temporary name, checked, renamed).
$MULTI30K_URL replaces the download address (a mirror, or a file:// folder of .gz files).
"""

from __future__ import annotations

import gzip
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
# The split sizes published in the dataset's README: a short or truncated download is refused.
SPLITS = {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
LANGUAGES = ("de", "en")
FILE_NAMES = [f"{split}.{lang}" for split in SPLITS for lang in LANGUAGES]


class FetchError(Exception):
    """A user-facing problem: the message is the whole explanation."""


def cache_folder() -> Path:
    """Returns the download folder: $TFM_CACHE/multi30k, else $XDG_CACHE_HOME/tfm/multi30k, else ~/.cache/..."""
    base = os.environ.get("TFM_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfm"
    return Path(base) / "multi30k"


def expected_lines(name: str) -> int:
    """Returns the published line count of one file name such as 'val.de'."""
    return SPLITS[name.rsplit(".", 1)[0]]


def missing_files(folder: Path) -> list[str]:
    """Returns the names of the six files that are not in `folder` (an empty list when all are)."""
    return [name for name in FILE_NAMES if not (folder / name).is_file()]


def download_one(name: str, base_url: str, folder: Path) -> None:
    """Downloads `name`.gz from `base_url`, checks its line count and writes `folder`/`name` atomically."""
    url = f"{base_url.rstrip('/')}/{name}.gz"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            text = gzip.decompress(response.read()).decode("utf-8")
    except (urllib.error.URLError, OSError, EOFError) as error:
        reason = getattr(error, "reason", error)
        raise FetchError(
            f"cannot download Multi30k {name} from {url} ({reason}); if this machine is offline, "
            f"put train/val/test_2016_flickr .de/.en in a folder and set MULTI30K_DIR to it"
        ) from None
    lines = text.count("\n")
    if lines != expected_lines(name):
        raise FetchError(f"{url} has {lines} lines, expected {expected_lines(name)}; the download is incomplete, run again")
    handle, temp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    with os.fdopen(handle, "w", encoding="utf-8") as temp:
        temp.write(text)
    os.replace(temp_name, folder / name)


def find_or_download() -> Path:
    """Returns the folder with the six Multi30k files, downloading them first when $MULTI30K_DIR is unset."""
    given = os.environ.get("MULTI30K_DIR")
    if given:
        folder = Path(given)
        missing = missing_files(folder)
        if missing:
            raise FetchError(f"MULTI30K_DIR={given} has no {missing[0]}; point it at a folder with "
                             f"{', '.join(FILE_NAMES)}, or unset it to download them")
        return folder
    folder = cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    base_url = os.environ.get("MULTI30K_URL", DEFAULT_URL)
    for name in missing_files(folder):
        print(f"downloading {name} into {folder}", file=sys.stderr)
        download_one(name, base_url, folder)
    return folder


def main() -> int:
    """Prints the data folder on stdout; returns the exit code."""
    try:
        print(find_or_download())
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # an unwritable cache folder or a full disk
        print(f"error: cannot write the Multi30k cache: {error}; set TFM_CACHE to a writable folder", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
