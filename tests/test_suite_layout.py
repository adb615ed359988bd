"""The test suite's own layout: shared helpers live in helper modules.

A test module that imports another one runs that module's tests' imports
and fixtures too, and ties two files that change for different reasons;
what several modules share belongs in ``_helpers.py``, ``_rigs.py`` or
``_bench.py``.
"""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).parent


def test_the_checker_finds_imported_test_modules() -> None:
    found = imported_test_modules(
        "from .test_conversation import echo\n"
        "from tests.test_fleet import model\n"
        "import tests.test_cli\n"
        "from ._rigs import open_rig\n"
        "from trio_dispatch.testing import FakeReply\n"
    )
    assert found == ["test_conversation", "test_fleet", "test_cli"]


def imported_test_modules(source: str) -> list[str]:
    """The names of the test modules ``source`` imports, in order."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        found += [part for parts in names for part in parts if part.startswith("test_")]
    return found


def test_no_test_module_imports_another() -> None:
    importing = {
        path.name: imported_test_modules(path.read_text(encoding="utf-8"))
        for path in sorted(TESTS.glob("*.py"))
    }
    assert len(importing) > 30
    assert {name: found for name, found in importing.items() if found} == {}
