"""Imports point one way: no cycle in the package, counting every import.

The module graph here holds every import of every module of
``trio_dispatch``: at module level, inside functions, and under ``if
TYPE_CHECKING:``. A cycle hidden in a function or behind the type checker
still ties two modules together. Plus the layers' own rules: the
dispatcher's plumbing imports nothing built on it, the integrations build
on the plumbing and import nothing of the ``Dispatcher`` (which makes
them), the Redis backend imports of the dispatcher only the backend
interface's values, the message values no rules, the policy core no I/O.

The command line, the demo and their plots (``trio_dispatch._cli``) stand
apart from the library: they are built on its public names, and nothing
else in the package imports them, so the library never loads rich,
matplotlib or the demo's machinery.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import trio_dispatch

PACKAGE = pathlib.Path(trio_dispatch.__file__).parent


def module_name(path: pathlib.Path) -> str:
    """``trio_dispatch._dispatch._dispatcher`` for its file."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


NAMES = frozenset(module_name(path) for path in PACKAGE.rglob("*.py"))


def imports_of(source: str, name: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the module ``name``) imports, anywhere in it.

    Relative imports are resolved; ``from package import module`` counts the
    module; a name of the package that is no module counts the package.
    """
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in NAMES else module)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        imported = imports_of(
            path.read_text(encoding="utf-8"),
            name,
            is_package=path.name == "__init__.py",
        )
        graph[name] = {module for module in imported if module in NAMES} - {name}
    return graph


GRAPH = _graph()
ALL_IMPORTS = {
    module_name(path): imports_of(
        path.read_text(encoding="utf-8"),
        module_name(path),
        is_package=path.name == "__init__.py",
    )
    for path in PACKAGE.rglob("*.py")
}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (its first module repeated at the end), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done or module not in graph:
            return None
        for imported in sorted(graph[module]):
            cycle = visit(imported, [*path, module])
            if cycle is not None:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle is not None:
            return cycle
    return None


def test_every_kind_of_import_is_collected() -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from .._policy._budgets import Throttle\n"
        "from .._integrations import _limited\n"
        "if TYPE_CHECKING:\n"
        "    from .._conversations._conversation import Conversation\n"
        "def later():\n"
        "    from .._integrations._transport import Hold\n"
        "    import trio_dispatch.providers\n"
    )
    found = imports_of(source, "trio_dispatch._dispatch._dispatcher")
    assert {
        "trio_dispatch._policy._budgets",
        "trio_dispatch._integrations._limited",
        "trio_dispatch._conversations._conversation",
        "trio_dispatch._integrations._transport",
        "trio_dispatch.providers",
    } <= found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_whole_import_graph_has_no_cycle() -> None:
    assert len(GRAPH) > 30
    cycle = find_cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle or ())


INTEGRATIONS = (
    "trio_dispatch._conversations._conversation",
    "trio_dispatch._integrations._kept",
    "trio_dispatch._integrations._limited",
    "trio_dispatch._integrations._transport",
    "trio_dispatch._integrations._transport_legacy",
    "trio_dispatch._integrations._metering",
)


# The dispatcher's machinery, split by concern: the plumbing, its slots,
# its settings, the setup it hands a new backend, its snapshot. The
# Dispatcher (``_dispatcher``) and open_dispatcher (``_open``) sit above the
# integrations, which they make.
CORE = (
    "trio_dispatch._dispatch._plumbing",
    "trio_dispatch._dispatch._settings",
    "trio_dispatch._dispatch._setup",
    "trio_dispatch._dispatch._slot",
    "trio_dispatch._dispatch._statistics",
)
ABOVE = ("trio_dispatch._dispatch._dispatcher", "trio_dispatch._dispatch._open")


def test_the_core_modules_exist() -> None:
    assert set(CORE) <= NAMES


@pytest.mark.parametrize("module", CORE)
def test_the_dispatcher_core_imports_nothing_built_on_it(module: str) -> None:
    imported = ALL_IMPORTS[module]
    assert not imported & set(INTEGRATIONS), imported & set(INTEGRATIONS)


@pytest.mark.parametrize("module", INTEGRATIONS)
def test_the_integrations_import_nothing_of_the_dispatcher_that_makes_them(
    module: str,
) -> None:
    assert not ALL_IMPORTS[module] & set(ABOVE), ALL_IMPORTS[module] & set(ABOVE)


@pytest.mark.parametrize(
    "module",
    ["trio_dispatch._dispatch._slot", "trio_dispatch._dispatch._statistics"],
)
def test_slots_and_statistics_import_nothing_of_the_dispatchers(module: str) -> None:
    assert not ALL_IMPORTS[module] & (set(CORE) - {module})


@pytest.mark.parametrize(
    "module", sorted(name for name in NAMES if name.startswith("trio_dispatch._redis"))
)
def test_the_redis_backend_imports_of_the_dispatcher_only_its_interface(
    module: str,
) -> None:
    # The backend interface and what the dispatcher hands a backend: the
    # Backend protocol and ProviderStatistics, the setup, the settings.
    interface = {
        "trio_dispatch._dispatch._backend",
        "trio_dispatch._dispatch._setup",
        "trio_dispatch._dispatch._settings",
    }
    dispatch = {
        name
        for name in ALL_IMPORTS[module]
        if name.startswith("trio_dispatch._dispatch")
    }
    assert dispatch <= interface, dispatch - interface
    assert not ALL_IMPORTS[module] & set(INTEGRATIONS)


@pytest.mark.parametrize(
    "module",
    sorted(name for name in NAMES if name.startswith("trio_dispatch.messages")),
)
def test_the_message_values_import_no_rules(module: str) -> None:
    rules = {"trio_dispatch._policy._budgets", "trio_dispatch._policy._slots"}
    assert not ALL_IMPORTS[module] & rules


PURE_CORE = [
    "trio_dispatch._policy._slots",
    "trio_dispatch._policy._budgets",
    "trio_dispatch._policy._tenants",
    "trio_dispatch._policy._latency",
    "trio_dispatch._policy._server",
]


@pytest.mark.parametrize("module", PURE_CORE)
def test_the_pure_core_imports_only_values_and_itself(module: str) -> None:
    # Outwards only: no backend, actor, integration or edge (the statistics
    # values the core returns live in the core, as BudgetStatistics does).
    inside = {
        imported
        for imported in ALL_IMPORTS[module]
        if imported.startswith("trio_dispatch")
    }
    allowed = {
        name
        for name in inside
        if name in PURE_CORE
        or name.startswith("trio_dispatch.messages")
        or name
        in {
            "trio_dispatch._exceptions",
            "trio_dispatch._validation",
            "trio_dispatch._policy._ratelimits",
            # A server's load: a value, as the rate-limit figures are.
            "trio_dispatch._server_load._load",
        }
    }
    assert inside == allowed, inside - allowed


@pytest.mark.parametrize("module", PURE_CORE)
def test_the_pure_core_imports_no_io_library(module: str) -> None:
    roots = {imported.split(".")[0] for imported in ALL_IMPORTS[module]}
    assert not roots & {"trio", "httpx", "httpx2", "coredis", "anyio"}, roots


SERVER_LOAD_CORE = [
    "trio_dispatch._server_load._load",
    "trio_dispatch._server_load._formats",
]


@pytest.mark.parametrize("module", SERVER_LOAD_CORE)
def test_a_server_s_load_and_its_parser_import_no_io_library(module: str) -> None:
    # The value and the parser stay pure, as the policy core: the reading
    # over HTTP (``_probe``) builds on them, never the reverse.
    roots = {imported.split(".")[0] for imported in ALL_IMPORTS[module]}
    assert not roots & {"trio", "httpx", "httpx2", "coredis", "anyio"}, roots
    assert "trio_dispatch._server_load._probe" not in ALL_IMPORTS[module]


def test_the_rules_above_would_catch_a_breach() -> None:
    # The dispatcher's own transport import of old, inside a function: found.
    # The plumbing's transport import, inside a function: found.
    breach = (
        "def transport():\n    from .._integrations._transport import transport_for\n"
    )
    found = imports_of(breach, "trio_dispatch._dispatch._plumbing")
    assert "trio_dispatch._integrations._transport" in found
    graph = {**GRAPH}
    graph["trio_dispatch._dispatch._plumbing"] = graph[
        "trio_dispatch._dispatch._plumbing"
    ] | {"trio_dispatch._integrations._transport"}
    assert find_cycle(graph) is not None
    # An integration typed against the Dispatcher, under TYPE_CHECKING: a
    # cycle with the Dispatcher that imports it.
    graph = {**GRAPH}
    graph["trio_dispatch._integrations._limited"] = graph[
        "trio_dispatch._integrations._limited"
    ] | {"trio_dispatch._dispatch._dispatcher"}
    assert find_cycle(graph) is not None


# -- the command line stands apart -------------------------------------------------

_CLI = "trio_dispatch._cli"


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
    assert (PACKAGE / "_cli" / "__init__.py").is_file()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
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
