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


def imported_packages(path: Path) -> set[str]:
    """The first-level parts of tfm_cli that a module imports (anywhere in it, function bodies included):
    a package name ("model", "inference", ...) or a top-level module's name ("checkpoint", ...)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfm_cli"):
            modules = [node.module] if node.module != "tfm_cli" else [f"tfm_cli.{a.name}" for a in node.names]
            found.update(module.split(".")[1] for module in modules if module.count(".") >= 1)
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("tfm_cli."))
    return found


# What each package may not import. model/ is the bottom layer; inference/ (searches, translation,
# alignments) and interop/ (other engines' formats) sit beside each other over it and the checkpoint;
# corpus/ (prepared training text) knows no model; training/ may use inference/ (validation translates)
# and corpus/; only commands/ and cli.py see everything.
FORBIDDEN = {
    "model": {"inference", "interop", "training", "commands", "checkpoints", "corpus", "tokenization"},
    "corpus": {"model", "inference", "interop", "training", "commands", "cli", "console", "checkpoint"},
    "checkpoints": {"inference", "interop", "commands", "cli", "console", "corpus"},
    "tokenization": {"model", "inference", "interop", "training", "commands", "cli", "console", "corpus", "checkpoints"},
    "inference": {"interop", "training", "commands", "cli", "console", "corpus"},
    "interop": {"inference", "training", "commands", "cli", "console", "corpus"},
    "training": {"interop", "commands", "cli", "console"},
}
# The top-level library modules (config, recipe, devices, ...) import no package above them.
TOP_LEVEL_FORBIDDEN = {"inference", "interop", "training", "commands", "cli", "console", "corpus", "checkpoints"}
EXCEPTIONS = {
    "checkpoints/averaging.py": {"training"},  # `average --run` reads a run folder, whose layout training/run_dir.py owns
}


def test_each_package_imports_only_what_its_layer_may():
    offenders = []
    for path in library_modules():
        parts = path.relative_to(PACKAGE).parts
        forbidden = FORBIDDEN.get(parts[0], set()) if len(parts) > 1 else TOP_LEVEL_FORBIDDEN
        forbidden = forbidden - EXCEPTIONS.get("/".join(parts), set())
        offenders += [f"{'/'.join(parts)} imports {name}" for name in sorted(imported_packages(path) & forbidden)]
    assert not offenders, offenders


MAX_TOP_LEVEL_MODULES = 15


def test_the_top_level_holds_few_modules_besides_the_packages():
    # A subsystem of several modules gets its package (corpus/, checkpoints/, textio/, ...), so a
    # newcomer finds it by its folder.
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


MAX_COMMAND_FUNCTION_LINES = 60  # commands are thin adapters: options in, a few library calls, results out


def function_body_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, line, body length) of every function in `source`: the lines from the first statement after
    the docstring to the last, so the signature (a Typer command's options) and the docstring do not count."""
    lengths = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                body = body[1:]
            if body:
                lengths.append((node.name, node.lineno, body[-1].end_lineno - body[0].lineno + 1))
    return lengths


def test_function_body_lengths_are_measured_after_the_signature_and_docstring():
    statements = "".join(f"    x{i} = {i}\n" for i in range(MAX_COMMAND_FUNCTION_LINES + 1))
    long = f'def long(\n    a: int = 1,\n    b: int = 2,\n) -> None:\n    """Docstring.\n\n    More.\n    """\n{statements}'
    others = 'def short():\n    """Only a docstring."""\n\n\ndef nested():\n    def inner():\n        return 1\n\n    return inner\n'
    lengths = [(name, length) for name, _, length in function_body_lengths(long + "\n\n" + others)]
    assert lengths == [("long", MAX_COMMAND_FUNCTION_LINES + 1), ("nested", 4), ("inner", 1)]


def test_no_command_function_is_longer_than_the_limit():
    # A longer body is a command doing the library's work, or several jobs that want names of their own.
    offenders = [
        f"{path.name}:{line} {name} has a {length}-line body"
        for path in sorted((PACKAGE / "commands").glob("*.py"))
        for name, line, length in function_body_lengths(path.read_text(encoding="utf-8"))
        if length > MAX_COMMAND_FUNCTION_LINES
    ]
    assert not offenders, f"over {MAX_COMMAND_FUNCTION_LINES} lines: {offenders}"
