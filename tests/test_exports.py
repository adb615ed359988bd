"""The public surface: every public name is exported, and only once."""

from __future__ import annotations

import importlib
import types

import pytest

import trio_dispatch

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
