"""The retry order benchmark (``bench/retry_order.py``), tiny.

Its structure, never its figures: orders in real time on a shared machine
are not a test (the order itself is guarded in virtual time, in
``test_transport_sdks.py`` and ``test_transport.py``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    # mypy reads bench/retry_order.py itself (bench/ is among its files).
    import retry_order
else:
    retry_order = load_bench_script("retry_order")

# The SDKs leave async generators of httpx2 unclosed: trio warns when they
# are collected.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|anthropic|httpx2|httpcore2)\.:ResourceWarning"
)


def test_the_retry_order_benchmark_runs_once_per_way_of_calling() -> None:
    report = retry_order.run_retry_order(runs=1)
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert data["runs"] == 1
    assert list(data["orders"]) == list(retry_order.PATHS)
    for orders in data["orders"].values():
        assert sum(orders.values()) == 1
        assert all(sorted(order.split()) == ["A", "B", "C"] for order in orders)
    table = report.to_markdown().splitlines()
    assert table[-5:-4] == ["|---|--:|---|"]
    assert [row.split(" | ")[0] for row in table[-4:]] == [
        f"| {path}" for path in retry_order.PATHS
    ]


def test_the_retry_order_benchmark_checks_its_runs() -> None:
    with pytest.raises(ValueError, match=r"^runs must be a positive integer, got 0$"):
        retry_order.run_retry_order(runs=0)
