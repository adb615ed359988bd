"""Smoke test of ``bench/instructions.py``: its workloads, its parsing, its report.

The instruction counts themselves are callgrind's; here the workloads run
without it (each must finish its cycles), a count is read from callgrind's
own words, and one real count, where valgrind is installed, grows with the
cycles run.
"""

from __future__ import annotations

import json
import shutil

import pytest

from .._bench import load_bench_script

bench = load_bench_script("instructions")


@pytest.mark.parametrize("key", sorted(bench.WORKLOADS))
def test_every_workload_runs_its_cycles(key: tuple[str, str]) -> None:
    workload, who = key
    assert bench.main(["--inner", workload, who, "3"]) == 0


def test_the_cycles_between_two_runs_count_every_task() -> None:
    assert bench.cycles_between("contended", 10, 40) == 30 * bench.TASKS
    assert bench.cycles_between("uncontended", 1_000, 11_000) == 10_000


def test_the_count_is_read_from_callgrinds_summary() -> None:
    stderr = "==1== Events    : Ir\n==1== Collected : 1284178579\n==1==\n"
    assert bench.collected(stderr) == 1_284_178_579
    with pytest.raises(
        ValueError, match=r"^no instruction count in callgrind's output"
    ):
        bench.collected("valgrind: command failed\n")


def test_the_report_gives_each_workloads_ratio() -> None:
    report = bench.InstructionsReport(
        (bench.Row("contended", 120_000.0, 80_000.0),), {"python": "CPython"}
    )
    assert report.rows[0].ratio == 1.5
    markdown = report.to_markdown()
    assert "| contended | 120,000 | 80,000 | 1.50 |" in markdown
    assert json.loads(report.to_json())["rows"] == [
        {"workload": "contended", "ours": 120_000.0, "theirs": 80_000.0, "ratio": 1.5}
    ]


def test_without_valgrind_it_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    assert bench.main([]) == 2
    assert capsys.readouterr().err == "bench/instructions.py needs valgrind on PATH\n"


@pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is not installed"
)
def test_a_real_count_grows_with_the_cycles() -> None:
    few = bench._count("uncontended", "CapacityLimiter", 10)
    more = bench._count("uncontended", "CapacityLimiter", 2_010)
    assert 0 < few < more


def test_the_floor_row_is_the_minimal_policy_beside_capacity_limiters_contended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A count per (workload, who, cycles), so the rows show where each came from.
    base = {
        ("contended", "trio-dispatch"): 120_000,
        ("contended", "CapacityLimiter"): 80_000,
        ("uncontended", "trio-dispatch"): 100_000,
        ("uncontended", "CapacityLimiter"): 50_000,
        ("contended, minimal policy", "trio-dispatch"): 96_000,
    }
    asked: list[tuple[str, str]] = []

    def count(workload: str, who: str, cycles: int) -> int:
        asked.append((workload, who))
        return (
            base[workload, who]
            * cycles
            * (bench.TASKS if workload.startswith("contended") else 1)
        )

    monkeypatch.setattr(bench, "_count", count)
    plain = bench.run_instructions()
    assert [row.workload for row in plain.rows] == ["contended", "uncontended"]
    floored = bench.run_instructions(floor=True)
    floor = floored.rows[-1]
    assert (floor.workload, floor.ours, floor.theirs) == (
        "contended, minimal policy",
        96_000,
        80_000,
    )
    # CapacityLimiter's contended count is not taken again for it.
    assert asked.count(("contended, minimal policy", "CapacityLimiter")) == 0
