"""Errors that say what to do.

Missing extras, arguments that need another, and one bound for a limit
everywhere.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import trio_dispatch
from trio_dispatch import AdaptiveLimit, open_dispatcher
from trio_dispatch.admin import MAX_LIMIT


def _run_without(blocked: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where ``blocked`` is not installed."""
    return subprocess.run(
        [sys.executable, "-c", f"import sys\nsys.modules[{blocked!r}] = None\n{code}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("blocked", "code", "hint"),
    [
        (
            "prometheus_client",
            "import trio_dispatch\ntrio_dispatch.metrics",
            "trio_dispatch.metrics needs the metrics extra:"
            " pip install 'trio-dispatch[metrics]'",
        ),
        (
            "prometheus_client",
            "import trio_dispatch.metrics",
            "trio_dispatch.metrics needs the metrics extra:"
            " pip install 'trio-dispatch[metrics]'",
        ),
        (
            "opentelemetry",
            "from trio_dispatch.otel import OpenTelemetryMetrics",
            "trio_dispatch.otel needs the otel extra: pip install 'trio-dispatch[otel]'",
        ),
        (
            "coredis",
            "import trio_dispatch\n"
            "trio_dispatch.open_dispatcher(redis_url='redis://127.0.0.1:6379/0')",
            "redis_url needs the redis extra: pip install 'trio-dispatch[redis]'",
        ),
    ],
)
def test_a_missing_extra_is_named_in_one_line(
    blocked: str, code: str, hint: str
) -> None:
    done = _run_without(blocked, code)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"ModuleNotFoundError: {hint}"


def test_a_missing_module_that_is_no_extra_is_left_as_it_is() -> None:
    # A broken install must not be blamed on a missing extra.
    done = _run_without(
        "trio_dispatch._observe._prometheus", "import trio_dispatch.metrics"
    )
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith(
        "ModuleNotFoundError: import of trio_dispatch._observe._prometheus"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"namespace": "my-fleet"}, "namespace needs redis_url"),
        ({"namespace": "trio-dispatch"}, "namespace needs redis_url"),
        ({"lease": 30.0}, "lease needs redis_url"),
        ({"lease": 15.0}, "lease needs redis_url"),
        ({"namespace": "my-fleet", "lease": 30.0}, "namespace needs redis_url"),
        ({"redis_connect_timeout": 10.0}, "redis_connect_timeout needs redis_url"),
        ({"redis_connect_timeout": 1}, "redis_connect_timeout needs redis_url"),
    ],
)
def test_namespace_lease_and_connect_timeout_without_redis_url_are_refused(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{message}$"):
        open_dispatcher({"p": 1}, **kwargs)  # type: ignore[arg-type]  # checked by the test


def test_namespace_lease_and_connect_timeout_with_redis_url_are_taken() -> None:
    # Nothing connects until the block is entered.
    open_dispatcher(
        {"p": 1},
        redis_url="redis://127.0.0.1:6379/0",
        namespace="f",
        lease=3.0,
        redis_connect_timeout=1.0,
    )


def test_the_admin_api_and_the_library_share_one_bound_for_a_limit() -> None:
    assert MAX_LIMIT == 100_000
    open_dispatcher({"p": MAX_LIMIT})
    AdaptiveLimit(initial=1, maximum=MAX_LIMIT)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: open_dispatcher({"p": 10**9}),
            "limit for 'p' must be at most 100000, got 1000000000",
        ),
        (
            lambda: open_dispatcher({"p": MAX_LIMIT + 1}),
            "limit for 'p' must be at most 100000, got 100001",
        ),
        (
            lambda: AdaptiveLimit(initial=1, maximum=10**6),
            "maximum must be at most 100000, got 1000000",
        ),
        (
            lambda: trio_dispatch.lowlevel.SlotPolicy(limit=MAX_LIMIT + 1),
            "limit must be at most 100000, got 100001",
        ),
    ],
)
def test_a_limit_above_the_bound_is_refused(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{message}$"):
        make()  # type: ignore[operator]  # a factory


async def test_set_limit_refuses_a_limit_above_the_bound() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(
            ValueError, match=r"^limit must be at most 100000, got 100001$"
        ):
            dispatcher.set_limit("p", MAX_LIMIT + 1)
        dispatcher.set_limit("p", MAX_LIMIT)
        assert dispatcher.statistics().providers["p"].limit == MAX_LIMIT
