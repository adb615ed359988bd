"""The public surface: every public name is exported, and only once."""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

import trio_dispatch
import trio_dispatch.actors

PACKAGES = [
    "trio_dispatch",
    "trio_dispatch.actors",
    "trio_dispatch.benchmarks",
    "trio_dispatch.messages",
    "trio_dispatch.providers",
    "trio_dispatch.testing",
]


def isort_style(name: str) -> tuple[int, str]:
    """Constants, then classes, then the rest (ruff's RUF022 order)."""
    if name.isupper():
        return (0, name)
    return (1 if name[0].isupper() else 2, name)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_complete(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=isort_style)
    public = {
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(exported)


def test_top_level_members_say_where_to_import_them_from() -> None:
    for attribute in trio_dispatch.__all__:
        assert getattr(trio_dispatch, attribute).__module__ == "trio_dispatch"


def test_version_is_a_string() -> None:
    assert isinstance(trio_dispatch.__version__, str)


def test_strategies_module_exports_what_it_defines() -> None:
    from trio_dispatch.testing import strategies  # noqa: PLC0415 (needs hypothesis)

    assert strategies.__all__ == sorted(strategies.__all__, key=isort_style)
    for name in strategies.__all__:
        assert hasattr(strategies, name), name


def test_conversation_options_are_exported_from_the_top_and_from_actors() -> None:
    assert "ConversationOptions" in trio_dispatch.__all__
    assert "ConversationOptions" in trio_dispatch.actors.__all__
    options = trio_dispatch.ConversationOptions
    assert options is trio_dispatch.actors.ConversationOptions
    assert options.__module__ == "trio_dispatch"


def _defined(tree: ast.Module) -> set[str]:
    """The names a module's own top-level code defines (imports excluded)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


PRIVATE_MODULES = sorted(
    path
    for path in Path(trio_dispatch.__file__).parent.rglob("_*.py")
    if path.name != "__init__.py"
)


@pytest.mark.parametrize("path", PRIVATE_MODULES, ids=[p.stem for p in PRIVATE_MODULES])
def test_a_private_module_lists_in_all_only_names_it_defines(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    listed: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            listed = ast.literal_eval(node.value)
    assert set(listed) <= _defined(tree)
