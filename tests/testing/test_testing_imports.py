"""How ``trio_dispatch.testing`` is put together: its modules' imports.

Type checkers follow ``TYPE_CHECKING`` imports too, so a cycle through them
is still a cycle to read and to type-check: the graph here counts them.
"""

from __future__ import annotations

import ast
import graphlib
import pathlib

import pytest

import trio_dispatch.testing

TESTING = pathlib.Path(trio_dispatch.testing.__file__).parent


def imports_of(path: pathlib.Path) -> set[str]:
    """The sibling modules ``path`` imports anywhere, type-only ones included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module)
            else:
                found.update(alias.name for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    """Every module of the testing package, and the siblings it imports."""
    return {path.stem: imports_of(path) for path in sorted(TESTING.glob("*.py"))}


def test_the_graph_reads_type_only_imports() -> None:
    graph = import_graph()
    assert {"_fake_server", "_encoders", "_script", "_quotas"} <= set(graph)
    # _quotas names WireFormat (from _script) for its type hints only.
    assert "_script" in graph["_quotas"]


def test_the_cycle_check_finds_a_cycle() -> None:
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).prepare()


def test_the_testing_package_has_no_import_cycle_even_for_type_checkers() -> None:
    graphlib.TopologicalSorter(import_graph()).prepare()
