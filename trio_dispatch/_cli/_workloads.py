"""What ``simulate`` and ``bench`` read from files: traces and configurations.

Everything here is read and checked before anything runs, and whatever is
wrong is a ``UsageError``: one line, exit status 2, no traceback.

A configuration (``--config``) is either a JSON file of ``open_dispatcher``
options, named after the file::

    {"priority_aging": 600, "max_waiting": 500,
     "limits": {"provider": {"initial": 8, "minimum": 2, "maximum": 32}},
     "tenants": {"acme": {"weight": 2, "limit": 4}},
     "budgets": {"provider": {"requests_per_minute": 600}}}

(a limit is an int or an ``AdaptiveLimit``'s fields, a tenant a
``Tenant``'s, a budget a ``Budget``'s), or ``FILE.py:NAME`` / ``MODULE:NAME``
naming a ``DispatcherConfig`` (named ``NAME`` unless it has a name of its
own) or a mapping of names to them: Python can give an order of its own
(``key``) or classes for turns (``priority``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import AdaptiveLimit, Budget, Tenant, open_dispatcher
from ._common import UsageError

if TYPE_CHECKING:
    from ..testing import DispatcherConfig, SimProvider, Workload


def read_trace(path: Path, providers: tuple[SimProvider, ...], seed: int) -> Workload:
    """The workload of a trace file; a bad record is a usage error."""
    from ..testing import Workload  # noqa: PLC0415

    try:
        return Workload.from_trace(path, providers, seed=seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_configs(specs: list[str]) -> dict[str, DispatcherConfig]:
    """Every ``--config``, by name, each checked by opening a dispatcher with it."""
    configs: dict[str, DispatcherConfig] = {}
    for spec in specs:
        for name, config in _read_config(spec).items():
            if name in configs:
                raise UsageError(f"two configurations are named {name!r}")
            _check_opens(spec, config)
            configs[name] = config
    return configs


def _read_config(spec: str) -> dict[str, DispatcherConfig]:
    from ..testing import DispatcherConfig  # noqa: PLC0415

    path = Path(spec)
    if path.suffix == ".json" or (":" not in spec and path.exists()):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read {spec}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"{spec} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise UsageError(
                f"{spec} must hold a JSON object of open_dispatcher options"
            )
        try:
            return {path.stem: DispatcherConfig(_options(data), name=path.stem)}
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{spec}: {exc}") from None
    where, _, attribute = spec.rpartition(":")
    if not where or not attribute:
        raise UsageError(
            f"--config takes a JSON file or FILE.py:NAME or MODULE:NAME, got {spec!r}"
        )
    value = getattr(_module(where, spec), attribute, None)
    if isinstance(value, DispatcherConfig):
        name = attribute if value.name == "configured" else value.name
        return {name: value}
    if isinstance(value, Mapping) and all(
        isinstance(v, DispatcherConfig) for v in value.values()
    ):
        return {str(name): config for name, config in value.items()}
    raise UsageError(
        f"{spec} must name a DispatcherConfig or a mapping of names to them,"
        f" got {type(value).__name__}"
    )


def _module(where: str, spec: str) -> Any:  # noqa: ANN401 (a module)
    try:
        if where.endswith(".py"):
            found = importlib.util.spec_from_file_location(Path(where).stem, where)
            if found is None or found.loader is None:
                raise UsageError(f"cannot load {where}")
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
            return module
        sys.path.insert(0, ".")
        try:
            return importlib.import_module(where)
        finally:
            sys.path.remove(".")
    except FileNotFoundError:
        raise UsageError(f"cannot read {where}: no such file") from None
    except ImportError as exc:
        raise UsageError(f"cannot import {where} for {spec}: {exc}") from None


_BUILDERS: dict[str, Any] = {"tenants": Tenant, "budgets": Budget}


def _options(data: dict[str, Any]) -> dict[str, Any]:
    """JSON's plain values as ``open_dispatcher``'s: limits, tenants, budgets."""
    options = dict(data)
    for field, build in _BUILDERS.items():
        if field in options:
            options[field] = {
                name: _build(build, fields, f"{field}.{name}")
                for name, fields in _mapping(options[field], field).items()
            }
    if "limits" in options:
        options["limits"] = {
            name: limit
            if isinstance(limit, int)
            else _build(AdaptiveLimit, limit, f"limits.{name}")
            for name, limit in _mapping(options["limits"], "limits").items()
        }
    return options


def _mapping(value: object, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be an object, got {value!r}")
    return value


def _build(cls: Any, fields: object, where: str) -> Any:  # noqa: ANN401 (a limits value)
    if not isinstance(fields, dict):
        raise ValueError(f"{where} must be an object of fields, got {fields!r}")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _check_opens(spec: str, config: DispatcherConfig) -> None:
    """Open (and close) a dispatcher with ``config``: its options are checked now."""
    import trio  # noqa: PLC0415

    options = dict(config.options)
    limits = options.pop("limits", None)

    async def open_and_close() -> None:
        async with open_dispatcher(limits, **options):
            pass

    try:
        trio.run(open_and_close)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{spec}: {exc}") from None
