"""`tfm cache list|clean`: the prepared corpora in a cache folder, and removing those no longer needed."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tfm_cli.commands import TfmCommand, TfmCommandGroup
from tfm_cli.console import data_table, print_info, stdout_console

GROUP_EPILOG = (
    "Examples:\n\n"
    "  tfm cache list /data/tfm-cache\n\n"
    "  tfm cache clean /data/tfm-cache --dry-run\n\n"
    "  tfm cache clean runs/de-en/cache --all\n\n"
    "Training runs never remove an entry (another run, container or host may be reading it); this does, "
    "and only entries that no process reads."
)
app = typer.Typer(
    cls=TfmCommandGroup,
    help="List the prepared corpora in a cache folder (data.cache_dir, or RUN/cache) and remove old ones.",
    epilog=GROUP_EPILOG,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

CACHE_HELP = "The cache folder: a recipe's data.cache_dir, or a run's RUN/cache."


FOREIGN_SHOWN = 20  # items named one per line; the rest are counted


def mebibytes(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def report_foreign(paths: list[Path], quiet: bool = False) -> None:
    """Name on stderr the items that look like tfm's but are not provably, so were left alone."""
    for path in paths[:FOREIGN_SHOWN]:
        print_info(f"not tfm's, left alone: {path}", quiet=quiet)
    if len(paths) > FOREIGN_SHOWN:
        print_info(f"and {len(paths) - FOREIGN_SHOWN} more items that are not tfm's, left alone", quiet=quiet)


@app.command("list", cls=TfmCommand, epilog="Example:\n\n  tfm cache list /data/tfm-cache")
def list_command(cache_dir: Path = typer.Argument(..., help=CACHE_HELP, show_default=False)) -> None:
    """One line per prepared corpus: folder, state, in use, size, pairs, text files.

    State: current (its text files are as they were), superseded (they changed or are gone), other version.

    On a terminal a table; piped, tab-separated lines.
    """
    from tfm_cli.corpus.cache_cleaning import foreign_items, list_entries

    entries = list_entries(cache_dir)
    rows = [[entry.path.name, entry.state, "yes" if entry.in_use else "no", mebibytes(entry.size_bytes),
             "" if entry.pairs is None else f"{entry.pairs:,}", " ".join(entry.files)] for entry in entries]
    if sys.stdout.isatty():
        stdout_console().print(data_table(["entry", "state", "in use", "size", "pairs", "text files"], rows))
    else:
        for row in rows:
            sys.stdout.write("\t".join(row) + "\n")
    report_foreign(foreign_items(cache_dir))
    print_info(f"{len(entries)} prepared corpora, {mebibytes(sum(entry.size_bytes for entry in entries))} in {cache_dir}")


@app.command("clean", cls=TfmCommand, epilog=(
    "Examples:\n\n  tfm cache clean /data/tfm-cache --dry-run\n\n  tfm cache clean /data/tfm-cache --all"
))
def clean_command(
    cache_dir: Path = typer.Argument(..., help=CACHE_HELP, show_default=False),
    everything: bool = typer.Option(False, "--all", help="Remove every entry no process reads, current ones and "
                                    "other versions' too (a later run prepares what it needs again)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print what would be removed."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No messages on stderr."),
) -> None:
    """Remove superseded entries that no process reads, temp folders of preparations that died, and stale refs.

    Prints each removed path on stdout. Entries a running process maps, on any host, are kept.

    Only what tfm can prove it made is removed: files and folders that merely look like its own (a
    `.ref` file, a `.tmp-` folder, another tool's manifest.json) are named on stderr and left alone.
    """
    from tfm_cli.corpus.cache_cleaning import clean_cache

    report = clean_cache(cache_dir, everything, dry_run)
    for path in [entry.path for entry in report.entries] + report.temp_folders + report.refs:
        sys.stdout.write(f"{path}\n")
    for entry in report.kept_in_use:
        print_info(f"kept {entry.path.name}: a running process reads it", quiet=quiet)
    report_foreign(report.foreign, quiet)
    verb = "would remove" if dry_run else "removed"
    freed = mebibytes(sum(entry.size_bytes for entry in report.entries))
    print_info(f"{verb} {len(report.entries)} entries ({freed}), {len(report.temp_folders)} temp folders, "
               f"{len(report.refs)} stale refs", quiet=quiet)
