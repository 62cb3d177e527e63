"""The documentation holds together: every relative link in README.md and docs/ reaches a file (and a
heading, where it names one), every command has its page, the README stays a short front door, and
its test command is the one CI runs. Each check is also run on a broken copy, so it can fail."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import typer

from conftest import REPO_ROOT
from tfm_cli.cli import app

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
CI_SCRIPT = REPO_ROOT / ".ci" / "run"
README_MAX_LINES = 250
DOC_FILES = [README, *sorted(DOCS.rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", flags=re.MULTILINE)


def prose(text: str) -> str:
    """`text` without fenced code blocks (a `# comment` there is no heading, `[x](y)` no link)."""
    return FENCE.sub("", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text in lower case, every character that is not a
    letter, digit, space, hyphen or underscore dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        slug = github_slug(heading)
        if slug in seen:
            seen[slug] += 1
            slug = f"{slug}-{seen[slug]}"
        else:
            seen[slug] = 0
        found.add(slug)
    return found


def relative_links(path: Path) -> list[str]:
    """The link targets of a markdown file that point inside the repository (not http:, mailto:, ...)."""
    text = INLINE_CODE.sub("", prose(path.read_text(encoding="utf-8")))
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def broken_links(path: Path) -> list[str]:
    """The relative links of `path` that reach no file or directory, or name a heading the file lacks."""
    broken = []
    for target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return broken


REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:tfm_cli|tests|bench|recipes|docs)/[\w./{},*-]*[\w/}])")


def expand_braces(path: str) -> list[str]:
    """`recipes/multi30k/{de-en,en-de}.toml` -> both paths, as the shell expands them."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [expanded for choice in match.group(1).split(",")
            for expanded in expand_braces(path[:match.start()] + choice + path[match.end():])]


def missing_repo_paths(path: Path) -> list[str]:
    """Paths in the repository (tfm_cli/..., tests/..., bench/..., recipes/..., docs/...) that `path`
    names, in prose or code, and that do not exist: a module that moved leaves its old name here."""
    missing = []
    for named in sorted(set(REPO_PATH.findall(path.read_text(encoding="utf-8")))):
        for candidate in expand_braces(named):
            if "*" in candidate:
                found = any(REPO_ROOT.glob(candidate))
            else:
                found = (REPO_ROOT / candidate).exists()
            if not found:
                missing.append(candidate)
    return missing


def command_names() -> list[str]:
    """The top-level commands the `tfm` app registers (a group such as `tokenize` is one command)."""
    return sorted(typer.main.get_command(app).commands)


def commands_without_page(names: list[str], docs: Path) -> list[str]:
    return [name for name in names if not (docs / "commands" / f"{name}.md").is_file()]


def is_short_front_door(readme_text: str) -> bool:
    return len(readme_text.splitlines()) < README_MAX_LINES


def readme_test_command(readme_text: str) -> str:
    """The one command line of the first code block in the README's "## Tests" section."""
    section = re.search(r"^## Tests\n(.*?)(?=^## |\Z)", readme_text, flags=re.MULTILINE | re.DOTALL)
    assert section, 'the README has no "## Tests" section'
    block = re.search(r"^```\w*\n(.*?)^```", section.group(1), flags=re.MULTILINE | re.DOTALL)
    assert block, 'the README\'s "## Tests" section has no code block'
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, f"the test command is one line to paste, got {lines}"
    return lines[0]


def ci_steps(ci_text: str) -> dict[str, str]:
    """What .ci/run does that the README's test command must do the same way: the torch pin, the
    editable install with its extras, and the pytest line."""
    code = [line.split(" #")[0].strip() for line in ci_text.splitlines() if not line.lstrip().startswith("#")]
    pytest_lines = [line for line in code if line.startswith("python -m pytest")]
    return {
        "torch": re.search(r"pip install (?:--quiet )?(torch==\S+)", ci_text).group(1),
        "install": re.search(r"pip install (?:--quiet )?(-e \S+)", ci_text).group(1),
        "pytest": pytest_lines[-1],
    }


def readme_steps(command: str) -> dict[str, str | None]:
    """The same three steps of a README command line (None where it has no such step)."""
    torch_pin = re.search(r"pip install (torch\S*)", command)
    install = re.search(r"pip install (-e \S+)", command)
    return {
        "torch": torch_pin and torch_pin.group(1),
        "install": install and install.group(1),
        "pytest": command.split("&&")[-1].strip(),
    }


# The checks on the repository's files.

@pytest.mark.parametrize("path", DOC_FILES, ids=[str(p.relative_to(REPO_ROOT)) for p in DOC_FILES])
def test_every_relative_link_reaches_a_file_and_its_heading(path):
    assert broken_links(path) == []



@pytest.mark.parametrize("path", DOC_FILES, ids=[str(p.relative_to(REPO_ROOT)) for p in DOC_FILES])
def test_every_module_test_and_script_the_docs_name_exists(path):
    assert missing_repo_paths(path) == []

def test_the_docs_have_links_to_check():
    assert len(DOC_FILES) > 10
    assert sum(len(relative_links(path)) for path in DOC_FILES) > 50


def test_every_command_has_its_page():
    names = command_names()
    assert {"tokenize", "train", "average", "translate", "score", "inspect-attention", "align", "train-aligner",
            "import", "export", "cache"} <= set(names)
    assert commands_without_page(names, DOCS) == []


def test_the_readme_is_a_short_front_door():
    assert is_short_front_door(README.read_text(encoding="utf-8"))


def test_the_readme_test_command_is_what_ci_runs():
    command = readme_test_command(README.read_text(encoding="utf-8"))
    assert readme_steps(command) == ci_steps(CI_SCRIPT.read_text(encoding="utf-8"))


def test_the_quickstart_installs_the_torch_ci_tests():
    readme = README.read_text(encoding="utf-8")
    quickstart = re.search(r"^python3 -m venv .*recipes/quickstart/run\.sh$", readme, flags=re.MULTILINE)
    assert quickstart, "the README's quickstart command is missing"
    assert readme_steps(quickstart.group(0) + " && x")["torch"] == ci_steps(CI_SCRIPT.read_text())["torch"]


# Each check on broken copies: it finds what it is there to find.

def test_github_slugs():
    assert github_slug("Fine-tuning (`--init`)") == "fine-tuning---init"
    assert github_slug("Multi30k: a real benchmark on a CPU") == "multi30k-a-real-benchmark-on-a-cpu"
    assert github_slug("Word alignment: AER on the Hansards gold set against eflomal (2026-12-01)") == \
        "word-alignment-aer-on-the-hansards-gold-set-against-eflomal-2026-12-01"
    assert github_slug("The [checkpoint](x.md) and data_dir") == "the-checkpoint-and-data_dir"


def test_the_link_check_finds_missing_files_and_headings(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n"
        "[ok](other.md) [ok](other.md#a-section) [ok](other.md#a-section-1) [ok](#here) [ok](https://x.org/y)\n"
        "[gone](missing.md) [no heading](other.md#nowhere) [no heading here](#there)\n"
        "`[code](not-a-link.md)`\n\n```bash\n# not a heading [x](also-not.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file", "other.md#nowhere: no heading #nowhere in other.md",
        "#there: no heading #there in page.md",
    ]


def test_the_page_check_finds_a_command_without_a_page(tmp_path):
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "train.md").write_text("# tfm train\n")
    assert commands_without_page(["train", "translate"], tmp_path) == ["translate"]


def test_the_ci_check_finds_a_different_test_command():
    ci = CI_SCRIPT.read_text(encoding="utf-8")
    command = readme_test_command(README.read_text(encoding="utf-8"))
    for changed in (command.replace("python -m pytest -q", "python -m pytest -q -m unit"),
                    command.replace("torch==", "torch>="), command.replace("[test,bench]", "[test]")):
        assert readme_steps(changed) != ci_steps(ci)
    with pytest.raises(AssertionError):
        readme_test_command("# tfm\n\n## Tests\n\nno command\n\n## Next\n\n```bash\npython -m pytest -q\n```\n")


def test_the_length_check_refuses_a_long_readme():
    assert is_short_front_door("line\n" * (README_MAX_LINES - 1))
    assert not is_short_front_door("line\n" * README_MAX_LINES)


def test_the_path_check_finds_a_module_that_moved(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("A filter is a class in `tfm_cli/corpus_filters.py`; recipes `recipes/multi30k/{de-en,xx-yy}.toml`,\n"
                    "run `python bench/whole_process.py`; not a repository path: /shared/runs/de-en, runs/tests/x.\n")
    assert missing_repo_paths(page) == ["recipes/multi30k/xx-yy.toml", "tfm_cli/corpus_filters.py"]
