"""Test tiers (tests/README.md): every test module has a tier in conftest.py, the overrides name real
tests, and pyproject.toml registers the markers strictly. A single test without exactly one tier fails
itself, in conftest.py's pytest_runtest_setup."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

from conftest import MODULE_TIERS, REPO_ROOT, TEST_TIERS, TIERS

TESTS = Path(__file__).resolve().parent


@functools.cache
def defined_tests(module: str) -> set[str]:
    """The names of the test functions a module defines."""
    tree = ast.parse((TESTS / f"{module}.py").read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_test_module_has_exactly_one_tier():
    modules = {path.stem for path in TESTS.glob("test_*.py")}
    untiered = sorted(modules - MODULE_TIERS.keys())
    assert not untiered, (
        f"test modules without a tier: {untiered}; add each to MODULE_TIERS in tests/conftest.py "
        f"as \"unit\", \"integration\" or \"system\" (tests/README.md, 'Test tiers')"
    )
    assert not MODULE_TIERS.keys() - modules, f"MODULE_TIERS names missing modules: {sorted(MODULE_TIERS.keys() - modules)}"
    assert set(MODULE_TIERS.values()) <= set(TIERS), MODULE_TIERS


def test_every_override_names_a_test_and_changes_its_tier():
    for key, tier in TEST_TIERS.items():
        module, name = key.split("::")
        assert tier in TIERS, f"{key}: {tier!r} is not a tier {TIERS}"
        assert module in MODULE_TIERS and name in defined_tests(module), f"TEST_TIERS names no test: {key}"
        assert tier != MODULE_TIERS[module], f"TEST_TIERS[{key!r}] repeats its module's tier {tier!r}"


def test_pyproject_registers_the_tiers_and_refuses_unknown_markers():
    options = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    registered = [marker.split(":")[0].strip() for marker in options["markers"]]
    assert registered == list(TIERS)
    assert "--strict-markers" in options["addopts"].split()
