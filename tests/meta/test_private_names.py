"""No module reads another's underscore names.

A name with a leading underscore belongs to the module that defines it:
what another module needs, its owner offers as a public (or ``lowlevel``)
name. Two reads are checked over the source of every module of the
package, with ``ast``:

- ``from module import _name``, where ``_name`` is not a module: an
  underscore name imported from elsewhere;
- ``value._name``, where ``value`` is not ``self`` or ``cls`` and the
  module defines no ``_name`` of its own (a function, a class, an
  attribute it assigns, a ``__slots__`` entry): another module's private
  attribute read through an object.

One name is allowed across modules: ``_create``, the private constructor
that ``NoPublicConstructor`` gives a class only a factory may build (as
trio's own ``Task._create``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import trio_dispatch

PACKAGE = pathlib.Path(trio_dispatch.__file__).parent
ALLOWED = frozenset({"_create"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_names(tree: ast.AST) -> set[str]:
    """The underscore names a module defines itself, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # __slots__ entries, attrs' private fields declared by string.
            names.add(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if _private(name)}


def foreign_reads(source: str, modules: frozenset[str]) -> list[str]:
    """What ``source`` reads of other modules' underscore names, as lines."""
    tree = ast.parse(source)
    own = own_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.extend(
                f"{node.lineno}: from {'.' * node.level}{node.module or ''}"
                f" import {alias.name}"
                for alias in node.names
                if _private(alias.name)
                and alias.name not in modules
                and alias.name not in ALLOWED
            )
        elif (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and node.attr not in ALLOWED
            and node.attr not in own
            and not (
                isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}
            )
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


MODULES = frozenset(path.stem for path in PACKAGE.rglob("*.py")) | frozenset(
    path.name for path in PACKAGE.rglob("*") if path.is_dir()
)


@pytest.mark.parametrize(
    "path",
    sorted(PACKAGE.rglob("*.py")),
    ids=lambda path: str(path.relative_to(PACKAGE)),
)
def test_no_module_reads_another_modules_underscore_names(path: pathlib.Path) -> None:
    assert foreign_reads(path.read_text(encoding="utf-8"), MODULES) == []


def test_the_check_catches_an_imported_underscore_name() -> None:
    source = "from ._validation import _shown\n"
    assert foreign_reads(source, MODULES) == ["1: from ._validation import _shown"]


def test_the_check_catches_a_foreign_underscore_attribute() -> None:
    source = "def f(slot):\n    return slot._grant\n"
    assert foreign_reads(source, MODULES) == ["2: slot._grant"]


def test_the_check_allows_a_modules_own_underscore_names() -> None:
    source = (
        "class A:\n"
        "    __slots__ = ('_x',)\n"
        "    def _y(self): ...\n"
        "def f(a: A) -> None:\n"
        "    a._x = 1\n"
        "    a._y()\n"
        "    return A._create()\n"
    )
    assert foreign_reads(source, MODULES) == []
