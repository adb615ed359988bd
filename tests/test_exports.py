"""The public surface: every public name is exported, and only once."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import types
from typing import TYPE_CHECKING

import pytest

import trio_dispatch

from ._bench import BENCH

if TYPE_CHECKING:
    from pathlib import Path

PACKAGES = [
    "trio_dispatch",
    "trio_dispatch.actors",
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


def test_the_package_installs_no_benchmarks() -> None:
    # The project's micro-benchmarks, with their targets, live in bench/;
    # users get the fairness sweep from trio_dispatch.testing.
    assert importlib.util.find_spec("trio_dispatch.benchmarks") is None


def private_imports(source: str) -> list[str]:
    """Every private trio_dispatch module or name that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            name
            for name in names
            if name.split(".")[0] == "trio_dispatch"
            and any(map(is_private, name.split(".")[1:]))
        ]
    return found


def is_private(name: str) -> bool:
    """``_name``, but not ``__name__`` (such as ``__version__``)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_private_imports_are_found() -> None:
    source = (
        "import trio_dispatch._converter\n"
        "from trio_dispatch.providers._limited import wrap_provider\n"
        "from trio_dispatch import __version__, open_dispatcher\n"
        "from trio_dispatch.testing import percentile\n"
        "from _common import count\n"
    )
    assert private_imports(source) == [
        "trio_dispatch._converter",
        "trio_dispatch.providers._limited.wrap_provider",
    ]


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_scripts_use_only_the_public_api(script: Path) -> None:
    assert private_imports(script.read_text(encoding="utf-8")) == []
