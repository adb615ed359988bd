"""The public surface: small, complete, named where it is imported from.

(The order of ``__all__`` is ruff's to check, RUF022, not ours.)

And the import graph under it: no cycle, and a policy core that needs
nothing but the standard library and attrs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
import subprocess
import sys
import tomllib
import types
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import trio_dispatch
import trio_dispatch.events
import trio_dispatch.lowlevel
import trio_dispatch.messages
import trio_dispatch.providers

from .._bench import BENCH

if TYPE_CHECKING:
    from pathlib import Path

PUBLIC_MODULES = [
    "trio_dispatch",
    "trio_dispatch.admin",
    "trio_dispatch.events",
    "trio_dispatch.lowlevel",
    "trio_dispatch.messages",
    "trio_dispatch.metrics",
    "trio_dispatch.otel",
    "trio_dispatch.providers",
    "trio_dispatch.testing",
]

PACKAGE = pathlib.Path(trio_dispatch.__file__).parent


def test_the_top_level_is_what_an_application_uses() -> None:
    # Written out on purpose: a name added here is an API decision.
    assert trio_dispatch.__all__ == [
        "SUMMARY_PREFIX",
        "AdaptiveLimit",
        "BackendUnavailable",
        "Budget",
        "BudgetStatistics",
        "Conversation",
        "ConversationClosed",
        "ConversationOptions",
        "ConversationStatistics",
        "DispatchError",
        "Dispatcher",
        "DispatcherClosed",
        "DispatcherStatistics",
        "Endpoint",
        "LeaseLost",
        "PoolProvider",
        "PoolRemoved",
        "PoolStatistics",
        "PoolUnreachable",
        "Provider",
        "ProviderError",
        "ProviderStatistics",
        "QueueFull",
        "Quota",
        "RateLimitInfo",
        "RequestOptions",
        "Retrying",
        "ServerLoad",
        "ServerLoadUnavailable",
        "ServerMetrics",
        "Slot",
        "SlotHoldTimeout",
        "Tenant",
        "TenantStatistics",
        "TooManyToolRounds",
        "Tool",
        "ToolResult",
        "Turn",
        "TurnEvent",
        "TurnFinished",
        "TurnResult",
        "TurnStream",
        "UnknownProviderWarning",
        "UnknownServerMetrics",
        "current_turn",
        "dump_history",
        "load_history",
        "open_dispatcher",
        "parse_server_load",
        "wrap_provider",
    ]


def test_the_simulator_and_its_workloads_are_public() -> None:
    # Written out on purpose: a name added here is an API decision.
    simulator = {
        "BurstArrivals",
        "CallsPerTurn",
        "Comparison",
        "DispatcherConfig",
        "Duration",
        "PoissonArrivals",
        "RateCurve",
        "Scenario",
        "SimCall",
        "SimProvider",
        "SimulationResult",
        "Trace",
        "TurnSpec",
        "Workload",
        "compare",
        "run_comparison",
        "run_simulation",
        "simulate",
    }
    assert simulator <= set(trio_dispatch.testing.__all__)
    for name in simulator:
        value = getattr(trio_dispatch.testing, name)
        assert value.__module__ == "trio_dispatch.testing", name
    from trio_dispatch.testing import strategies  # noqa: PLC0415 (needs hypothesis)

    assert {"calls_per_turn", "durations", "workloads"} <= set(strategies.__all__)


def test_the_plumbing_is_in_lowlevel_only() -> None:
    plumbing = {"Ticket", "SlotPolicy", "PolicyStatistics", "SchedulerActor"}
    plumbing |= {"Acquire", "Release", "Cancel", "Grant", "Reply", "SetLimit"}
    plumbing |= {"Pause", "Resume", "SchedulerMessage", "check_arguments"}
    assert plumbing <= set(trio_dispatch.lowlevel.__all__)
    for name in ("trio_dispatch", "trio_dispatch.messages", "trio_dispatch.providers"):
        assert not plumbing & set(importlib.import_module(name).__all__), name


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_complete(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    for attribute in exported:
        getattr(module, attribute)  # a name imported when first used, too
    public = {
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(exported)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_name_says_a_public_module(name: str) -> None:
    module = importlib.import_module(name)
    for attribute in module.__all__:
        value = getattr(module, attribute)
        if isinstance(value, type | types.FunctionType):
            assert value.__module__ in PUBLIC_MODULES, (attribute, value.__module__)


def test_each_name_says_the_first_public_module_that_exports_it() -> None:
    assert trio_dispatch.ProviderError.__module__ == "trio_dispatch"
    assert trio_dispatch.providers.ProviderError is trio_dispatch.ProviderError
    assert trio_dispatch.providers.RateLimited.__module__ == "trio_dispatch.providers"
    assert trio_dispatch.lowlevel.Ticket.__module__ == "trio_dispatch.lowlevel"
    assert trio_dispatch.messages.ChatMessage.__module__ == "trio_dispatch.messages"


def test_attrs_values_still_resolve_their_hints_after_the_move() -> None:
    # get_type_hints looks names up in the module __module__ names.
    import typing  # noqa: PLC0415 (only this test needs it)

    hints = typing.get_type_hints(trio_dispatch.messages.ChatRequest)
    assert "messages" in hints


@pytest.mark.parametrize(
    "cls", [trio_dispatch.Dispatcher, trio_dispatch.Slot, trio_dispatch.Conversation]
)
def test_objects_only_a_factory_builds_have_no_public_constructor(cls: type) -> None:
    with pytest.raises(
        TypeError, match=r"^trio_dispatch\.\w+ has no public constructor$"
    ):
        cls()


def test_version_is_a_string() -> None:
    assert isinstance(trio_dispatch.__version__, str)


def test_the_version_is_written_once_as_a_pep_440_pre_release() -> None:
    from packaging.version import Version  # noqa: PLC0415 (pytest's own dependency)

    root = pathlib.Path(__file__).resolve().parent.parent.parent
    pyproject = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))
    # The package's metadata takes it from the module trio_dispatch
    # re-exports it from: no second copy.
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["hatch"]["version"]["path"] == "trio_dispatch/_version.py"
    version = Version(trio_dispatch.__version__)
    assert str(version) == trio_dispatch.__version__  # in its normal form
    # Unreleased: a development version of the next release.
    assert version.is_devrelease


def test_strategies_module_exports_what_it_defines() -> None:
    from trio_dispatch.testing import strategies  # noqa: PLC0415 (needs hypothesis)

    for name in strategies.__all__:
        assert hasattr(strategies, name), name


# -- the import graph --------------------------------------------------------


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(path: pathlib.Path) -> set[str]:
    """What a module imports when it is imported: module level, not for types."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            continue
        statements = node.body if isinstance(node, ast.Try) else [node]
        for statement in statements:
            if isinstance(statement, ast.Import):
                found.update(alias.name for alias in statement.names)
            elif isinstance(statement, ast.ImportFrom):
                if statement.level:
                    base = package.rsplit(".", statement.level - 1)[0]
                    module = f"{base}.{statement.module}" if statement.module else base
                else:
                    module = statement.module or ""
                for alias in statement.names:
                    submodule = f"{module}.{alias.name}"
                    found.add(submodule if submodule in GRAPH_NAMES else module)
    return found


GRAPH_NAMES = {_module_name(path) for path in PACKAGE.rglob("*.py")}
GRAPH = {
    _module_name(path): {
        imported
        for imported in _runtime_imports(path)
        if imported.split(".")[0] == "trio_dispatch"
    }
    for path in PACKAGE.rglob("*.py")
}


def test_the_policy_core_needs_only_the_standard_library_and_attrs() -> None:
    core: set[str] = set()
    stack = ["trio_dispatch._policy._slots"]
    while stack:
        module = stack.pop()
        if module in core:
            continue
        core.add(module)
        stack.extend(GRAPH[module] - {"trio_dispatch"})
    outside: set[str] = set()
    for module in core:
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        outside |= {
            imported.split(".")[0]
            for imported in _runtime_imports(path)
            if imported.split(".")[0] != "trio_dispatch"
        }
    assert outside <= set(sys.stdlib_module_names) | {"attrs", "__future__"}, outside
    assert "trio_dispatch.actors._scheduler" not in core


def test_importing_the_package_loads_no_http_or_optional_library() -> None:
    code = (
        "import sys, trio_dispatch, trio_dispatch.lowlevel\n"
        "heavy = {'httpx', 'httpx2', 'httpx_sse', 'httpcore', 'httpcore2', 'cattrs',"
        " 'hypercorn', 'hypothesis', 'rich', 'matplotlib', 'prometheus_client',"
        " 'opentelemetry'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout == "[]\n"


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


def test_conversation_options_are_public() -> None:
    assert "ConversationOptions" in trio_dispatch.__all__
    assert trio_dispatch.ConversationOptions.__module__ == "trio_dispatch"


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
    path for path in PACKAGE.rglob("_*.py") if path.name != "__init__.py"
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


def test_subpackages_load_on_first_attribute_access() -> None:
    # import trio_dispatch, then trio_dispatch.events.Granted, as docs/manual.md
    # shows it; the extras load only with the subpackage that needs them.
    code = (
        "import sys, trio_dispatch\n"
        "assert 'prometheus_client' not in sys.modules\n"
        "print(trio_dispatch.events.Granted.__module__)\n"
        "print(trio_dispatch.providers.OpenAIProvider.__module__)\n"
        "print(trio_dispatch.testing.FakeReply.__module__)\n"
        "print(trio_dispatch.metrics.PrometheusCollector.__module__)\n"
        "print(trio_dispatch.otel.OpenTelemetryMetrics.__module__)\n"
        "print(trio_dispatch.admin.admin_app.__module__)\n"
        "print('prometheus_client' in sys.modules)\n"
        "print(trio_dispatch.metrics is sys.modules['trio_dispatch.metrics'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [
        "trio_dispatch.events",
        "trio_dispatch.providers",
        "trio_dispatch.testing",
        "trio_dispatch.metrics",
        "trio_dispatch.otel",
        "trio_dispatch.admin",
        "True",
        "True",
    ]


def test_every_public_subpackage_is_an_attribute_of_the_package() -> None:
    subpackages = {name.rpartition(".")[2] for name in PUBLIC_MODULES[1:]}
    assert subpackages <= set(dir(trio_dispatch))
    assert set(trio_dispatch.__all__) <= set(dir(trio_dispatch))
    for name in subpackages:
        assert getattr(trio_dispatch, name).__name__ == f"trio_dispatch.{name}"
    with pytest.raises(
        AttributeError, match=r"^module 'trio_dispatch' has no attribute 'event'$"
    ):
        trio_dispatch.event  # noqa: B018  # the misspelling is the test
