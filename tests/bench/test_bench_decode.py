"""Smoke test of ``bench/decode.py`` at its ``--quick`` size.

It checks the reports' structure and that every figure is a positive finite
number, never how fast anything ran: timings on a shared machine are not a
test.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
from typing import TYPE_CHECKING, Any

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    from types import ModuleType

BENCH = pathlib.Path(__file__).resolve().parent.parent.parent / "bench" / "decode.py"


def load_bench() -> ModuleType:
    return load_bench_script("decode")


def sdk_installed(name: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in (name, "httpx2"))


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Any], str, str]:
    out = tmp_path_factory.mktemp("reports")
    assert load_bench().main(["--quick", "--out", str(out)]) == 0
    report = json.loads((out / "decode.json").read_text(encoding="utf-8"))
    markdown = (out / "decode.md").read_text(encoding="utf-8")
    return report, markdown, str(out)


def positive_finite(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_every_case_has_every_client_with_positive_finite_figures(
    quick_run: tuple[dict[str, Any], str, str],
) -> None:
    report, _, _ = quick_run
    assert (report["chunks"], report["repeats"], report["quick"]) == (200, 3, True)
    cases = [(case["format"], case["kind"]) for case in report["cases"]]
    assert cases == [
        (fmt, kind)
        for fmt in ("openai", "anthropic")
        for kind in ("text", "reasoning", "tool")
    ]
    ours_ratios = []
    for case in report["cases"]:
        expected = ["minimal", "provider", "slot"]
        if sdk_installed(case["format"]):
            expected.append("sdk")
        assert [result["client"] for result in case["clients"]] == expected
        for result in case["clients"]:
            for series in ("samples_us", "ratios", "wall_us"):
                assert len(result[series]) == 3
                assert all(positive_finite(v) for v in result[series])
            assert positive_finite(result["per_chunk_us"])
            assert positive_finite(result["ratio"])
            if result["client"] == "minimal":
                assert result["ratios"] == [1.0, 1.0, 1.0]
            elif result["client"] in ("provider", "slot"):
                ours_ratios.append(result["ratio"])
    assert report["worst_ratio"] == max(ours_ratios)
    assert report["met"] == (report["worst_ratio"] <= report["target"] == 1.3)
    assert report["skipped"] == [
        name for name in ("openai", "anthropic") if not sdk_installed(name)
    ]


def test_the_markdown_report_has_a_row_per_client(
    quick_run: tuple[dict[str, Any], str, str],
) -> None:
    report, markdown, _ = quick_run
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert rows[0] == (
        "| Format | Deltas | Client | CPU µs per chunk | vs minimal loop |"
    )
    expected = sum(len(case["clients"]) for case in report["cases"])
    assert len(rows) == 1 + expected
    assert f"Highest ratio of our providers: **{report['worst_ratio']:.2f}x**" in (
        markdown
    )


def test_bad_sizes_are_refused_before_anything_runs() -> None:
    bench = load_bench()
    with pytest.raises(
        ValueError, match=r"^chunks must be an integer of at least 2, got 1$"
    ):
        bench.run(chunks=1, repeats=1)
    with pytest.raises(
        ValueError, match=r"^repeats must be a positive integer, got 0$"
    ):
        bench.run(chunks=2, repeats=0)
