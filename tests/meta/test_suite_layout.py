"""The test suite's own layout: shared helpers live in helper modules.

A test module that imports another one runs that module's tests' imports
and fixtures too, and ties two files that change for different reasons;
what several modules share belongs in ``_helpers.py``, ``_rigs.py`` or
``_bench.py``.
"""

from __future__ import annotations

import ast
import pathlib

import trio_dispatch

TESTS = pathlib.Path(__file__).parent.parent


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
        for path in sorted(TESTS.rglob("*.py"))
    }
    assert len(importing) > 30
    assert {name: found for name, found in importing.items() if found} == {}


def raises_sigint_unprepared(source: str) -> list[str]:
    """The tests in ``source`` that raise SIGINT in-process unprepared.

    Where SIGINT is ignored (a background job, many CI runners) a raised
    SIGINT does nothing, and a test waiting for its KeyboardInterrupt hangs.
    Such a test takes the ``ctrl_c`` fixture, or sets SIGINT's handler
    itself.
    """
    found: list[str] = []
    for test in ast.walk(ast.parse(source)):
        if not isinstance(test, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if not test.name.startswith("test_"):
            continue
        calls = [
            ast.unparse(node.func)
            for node in ast.walk(test)
            if isinstance(node, ast.Call)
            and any("SIGINT" in ast.unparse(arg) for arg in node.args)
        ]
        raises = any(c.endswith(("raise_signal", "os.kill")) for c in calls)
        sets_handler = any(c.endswith("signal.signal") for c in calls)
        prepared = "ctrl_c" in [a.arg for a in test.args.args] or any(
            "ctrl_c" in ast.unparse(d) for d in test.decorator_list
        )
        if raises and not (sets_handler or prepared):
            found.append(test.name)
    return found


def test_the_checker_finds_tests_that_raise_sigint_unprepared() -> None:
    source = (
        "def test_bare():\n    signal.raise_signal(signal.SIGINT)\n"
        "def test_kill():\n    os.kill(os.getpid(), SIGINT)\n"
        "def test_nested():\n"
        "    async def press():\n        signal.raise_signal(signal.SIGINT)\n"
        "@pytest.mark.usefixtures('ctrl_c')\n"
        "def test_marked():\n    signal.raise_signal(signal.SIGINT)\n"
        "def test_taking_it(ctrl_c):\n    signal.raise_signal(signal.SIGINT)\n"
        "def test_ignoring():\n"
        "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "def test_other_signal():\n    signal.raise_signal(signal.SIGTERM)\n"
    )
    assert raises_sigint_unprepared(source) == ["test_bare", "test_kill", "test_nested"]


def test_every_test_raising_sigint_makes_it_a_keyboard_interrupt() -> None:
    unprepared = {
        path.name: found
        for path in sorted(TESTS.rglob("test_*.py"))
        if (found := raises_sigint_unprepared(path.read_text(encoding="utf-8")))
    }
    assert unprepared == {}


# Each folder of tests and the part of the package it tests (None: the
# benchmarks' scripts, and these tests of the suite and the package's shape).
MIRRORS = {
    "actors": "actors",
    "bench": None,
    "cli": "_cli",
    "conversations": "_conversations",
    "dispatch": "_dispatch",
    "integrations": "_integrations",
    "meta": None,
    "observe": "_observe",
    "policy": "_policy",
    "providers": "providers",
    "redis": "_redis",
    "server_load": "_server_load",
    "testing": "testing",
    "wire": "_wire",
}


def test_the_tests_mirror_the_package() -> None:
    package = pathlib.Path(trio_dispatch.__file__).parent
    assert sorted(path.name for path in TESTS.glob("test_*.py")) == []
    folders = {
        path.name
        for path in TESTS.iterdir()
        if path.is_dir() and (path / "__init__.py").is_file()
    }
    assert folders == set(MIRRORS)
    for folder, part in MIRRORS.items():
        assert list((TESTS / folder).glob("test_*.py")), folder
        if part is not None:
            assert (package / part / "__init__.py").is_file(), part
