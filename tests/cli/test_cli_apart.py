"""The command line, the demo and their plots stand apart from the library.

They live in ``trio_dispatch._cli`` and are built on the library's public
names; nothing else in the package imports them, so the library never
loads rich, matplotlib or the demo's machinery.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trio_dispatch

_PACKAGE = Path(trio_dispatch.__file__).parent
_CLI = "trio_dispatch._cli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(_PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(text: str, package: str) -> set[str]:
    """Every module ``text`` imports, anywhere (functions, TYPE_CHECKING).

    ``package`` is the package relative imports start from. ``from x
    import y`` counts as importing ``x.y`` too (``y`` may be a module), and
    ``importlib.import_module("x")`` with a literal counts as well.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in {"importlib.import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _cli_imports(text: str, package: str) -> list[str]:
    return sorted(
        module
        for module in _imported(text, package)
        if module == _CLI or module.startswith(f"{_CLI}.")
    )


def test_nothing_in_the_library_imports_the_command_line() -> None:
    # The command line, the demo and their plots are built on the library,
    # never the other way: an import of them from anywhere else in the
    # package is refused, at module level, in a function or under
    # TYPE_CHECKING.
    assert (_PACKAGE / "_cli" / "__init__.py").is_file()
    found = {}
    for path in sorted(_PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name == _CLI or name.startswith(f"{_CLI}."):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imports = _cli_imports(path.read_text(encoding="utf-8"), package)
        if imports:
            found[name] = imports
    assert found == {}


@pytest.mark.parametrize(
    ("text", "package"),
    [
        ("from ._cli import main\n", "trio_dispatch"),
        ("def f():\n    from . import _cli\n", "trio_dispatch"),
        (
            "if TYPE_CHECKING:\n    from .._cli._demo import DemoReport\n",
            "trio_dispatch.testing",
        ),
        ("import trio_dispatch._cli._main\n", "trio_dispatch.admin"),
        ("importlib.import_module('trio_dispatch._cli')\n", "trio_dispatch"),
    ],
)
def test_the_import_check_sees_every_kind_of_import(text: str, package: str) -> None:
    # What the check above forbids, it must find, however it is written.
    assert _cli_imports(text, package) != []
    assert _cli_imports("from . import _validation\n", package) == []
