"""Smoke test of ``bench/models.py``: its ``--quick`` run, its report's shape.

The fleet runs over loopback HTTP, on trio's ``MockClock`` (the server's
buckets and the dispatcher alike), so its figures hardly depend on the
machine: the bars are checked on the quick run itself, with room to spare.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.:ResourceWarning"
)


def _run(tmp_path: pathlib.Path, *argv: str) -> dict[str, Any]:
    bench = load_bench_script("models")
    path = tmp_path / "models.json"
    assert bench.main(["--quick", *argv, "--json", str(path)]) == 0
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert (report["seconds"], report["limit"]) == (60, 16)
    for arm in report["arms"]:
        models = {m["model"]: m for m in arm["models"]}
        assert sorted(models) == ["fast-model", "slow-model"]
        assert arm["requests"] == sum(m["requests"] for m in models.values())
        assert arm["answered_429"] == sum(m["answered_429"] for m in models.values())
        assert arm["share_429"] == pytest.approx(arm["answered_429"] / arm["requests"])
        for m in models.values():
            assert m["per_minute"] > 0
            assert m["goodput"] == pytest.approx(
                m["per_minute"] / m["quota_per_minute"]
            )
            # The server holds each model to its quota whatever the client does.
            assert m["goodput"] <= 1.1
    return report


def test_one_budget_for_both_models_misses_one_of_the_bars(
    tmp_path: pathlib.Path,
) -> None:
    report = _run(tmp_path, "--arm", "shared")
    [arm] = report["arms"]
    fast = next(m for m in arm["models"] if m["model"] == "fast-model")
    # Learned from both models' figures, one budget holds the fast model
    # far below its quota (and lets the slow one meet 429s besides).
    assert fast["goodput"] < 0.8


def test_a_budget_per_model_meets_both(tmp_path: pathlib.Path) -> None:
    arms = ["per-model", "transport", "configured"]
    report = _run(tmp_path, *(f"--arm={arm}" for arm in arms))
    assert [arm["arm"] for arm in report["arms"]] == arms
    for arm in report["arms"]:
        assert arm["share_429"] <= 0.02
        fast = next(m for m in arm["models"] if m["model"] == "fast-model")
        slow = next(m for m in arm["models"] if m["model"] == "slow-model")
        assert fast["goodput"] >= 0.9
        assert slow["goodput"] >= 0.8
