"""The package's seams: which modules may talk to people, and which way imports go."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tfm_cli"
# The command-line layer: the only modules that print, or import Typer or rich.
INTERFACE = {"cli.py", "console.py", "__main__.py"}


def library_modules() -> list[Path]:
    """Every module of tfm_cli outside the command-line layer (commands/, cli.py, console.py)."""
    return [
        path for path in sorted(PACKAGE.rglob("*.py"))
        if path.name not in INTERFACE and "commands" not in path.relative_to(PACKAGE).parts
    ]


def test_library_modules_never_print_or_import_the_cli_libraries():
    offenders = []
    for path in library_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.name}:{node.lineno} print()")
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in ("typer", "rich")]
    assert not offenders, offenders


def test_config_imports_no_other_tfm_module_but_errors_and_special_ids():
    # Imports go one way: tokenizer, data, model and training read config, never the reverse.
    code = (
        "import sys, tfm_cli.config; "
        "print(sorted(m for m in sys.modules if m.startswith('tfm_cli.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['tfm_cli.config', 'tfm_cli.errors', 'tfm_cli.special_ids']"
