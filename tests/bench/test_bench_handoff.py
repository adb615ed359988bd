"""Smoke test of the hand-off benchmarks (``bench/handoff.py``) at tiny sizes.

It checks the report's shape and that its numbers hang together, never how
fast anything ran: timings on a shared machine are not a test.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import TYPE_CHECKING

import attrs
import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    from pathlib import Path

    # mypy reads bench/handoff.py itself (bench/ is among its files).
    import handoff
else:
    handoff = load_bench_script("handoff")

HandoffReport = handoff.HandoffReport
HandoffSizes = handoff.HandoffSizes
Measurement = handoff.Measurement
run_handoff_benchmarks = handoff.run_handoff_benchmarks

TINY = HandoffSizes(
    tasks=6,
    cycles=3,
    limit=2,
    round_trips=20,
    waiters=(3, 12),
    min_grants=12,
    memory_waiters=40,
)
REPEATS = 2


@pytest.fixture(scope="module")
def run() -> tuple[HandoffReport, list[str]]:
    lines: list[str] = []
    report = run_handoff_benchmarks(
        repeats=REPEATS, sizes=TINY, quick=True, progress=lines.append
    )
    return report, lines


def check_summary(measurement: Measurement) -> None:
    ours, theirs = measurement.ours_samples, measurement.theirs_samples
    assert len(ours) == len(theirs) >= 1
    for sample in (*ours, *theirs):
        assert math.isfinite(sample)
        assert sample > 0
    assert measurement.ours == statistics.median(ours)
    assert measurement.theirs == statistics.median(theirs)
    ratios = [o / t for o, t in zip(ours, theirs, strict=True)]
    assert measurement.ratio == statistics.median(ratios)
    assert min(ratios) <= measurement.ratio <= max(ratios)


def test_report_has_every_measurement_with_paired_samples(
    run: tuple[HandoffReport, list[str]],
) -> None:
    report, _ = run
    assert [m.key for m in report.measurements] == [
        "contended",
        "uncontended",
        "scaling_3",
        "scaling_12",
        "scaling_growth",
        "memory",
    ]
    for measurement in report.measurements:
        check_summary(measurement)
        expected = 1 if measurement.key == "memory" else REPEATS
        assert len(measurement.ours_samples) == expected
    assert report.measurement("contended").higher_is_better
    assert not report.measurement("uncontended").higher_is_better
    assert (report.sizes, report.repeats, report.quick) == (TINY, REPEATS, True)
    with pytest.raises(KeyError):
        report.measurement("nothing")


def test_scaling_growth_is_the_per_pair_ratio_of_the_extreme_sizes(
    run: tuple[HandoffReport, list[str]],
) -> None:
    report, _ = run
    small, large = report.measurement("scaling_3"), report.measurement("scaling_12")
    growth = report.measurement("scaling_growth")
    assert growth.ours_samples == tuple(
        b / a for a, b in zip(small.ours_samples, large.ours_samples, strict=True)
    )
    assert growth.theirs_samples == tuple(
        b / a for a, b in zip(small.theirs_samples, large.theirs_samples, strict=True)
    )


def test_targets_are_checked_against_the_measurements(
    run: tuple[HandoffReport, list[str]],
) -> None:
    report, _ = run
    by_key = {target.key: target for target in report.targets}
    assert list(by_key) == [
        "contended_ratio",
        "uncontended_ratio",
        "scaling_growth",
        "memory_per_waiter",
    ]
    assert by_key["contended_ratio"].value == report.measurement("contended").ratio
    assert by_key["uncontended_ratio"].value == report.measurement("uncontended").ratio
    assert by_key["scaling_growth"].value == report.measurement("scaling_growth").ours
    assert by_key["memory_per_waiter"].value == report.measurement("memory").ours
    for target in report.targets:
        if target.comparison == "<=":
            assert target.met == (target.value <= target.threshold)
        else:
            assert target.met == (target.value >= target.threshold)
    assert report.all_met == all(target.met for target in report.targets)


def test_json_holds_the_same_numbers(run: tuple[HandoffReport, list[str]]) -> None:
    report, _ = run
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert data["all_met"] == report.all_met
    assert data["repeats"] == REPEATS
    assert data["sizes"]["waiters"] == [3, 12]
    for loaded, measurement in zip(
        data["measurements"], report.measurements, strict=True
    ):
        assert loaded["key"] == measurement.key
        assert loaded["ours"] == measurement.ours
        assert loaded["ratio"] == measurement.ratio
        assert loaded["theirs_samples"] == list(measurement.theirs_samples)
    assert [t["met"] for t in data["targets"]] == [t.met for t in report.targets]


def test_markdown_has_a_row_per_measurement_and_target(
    run: tuple[HandoffReport, list[str]],
) -> None:
    report, _ = run
    rows = [line for line in report.to_markdown().splitlines() if line.startswith("|")]
    # Two tables, each with a header and a separator row.
    assert len(rows) == len(report.measurements) + len(report.targets) + 4
    for measurement in report.measurements:
        assert any(row.startswith(f"| {measurement.label} |") for row in rows)
    for target in report.targets:
        assert any(row.startswith(f"| {target.label} |") for row in rows)


def test_progress_reports_each_pair(run: tuple[HandoffReport, list[str]]) -> None:
    _, lines = run
    assert lines[0] == "warm-up"
    assert "contended: pair 2/2" in lines
    assert "scaling 12 waiters: pair 2/2" in lines
    assert lines[-1] == "memory: pair 1/1"


def test_sizes_are_checked() -> None:
    with pytest.raises(
        ValueError,
        match=r"^waiters must be increasing positive integers, got \(5, 5\)$",
    ):
        HandoffSizes(waiters=(5, 5))
    with pytest.raises(ValueError, match=r"^tasks must be a positive integer, got 0$"):
        HandoffSizes(tasks=0)
    with pytest.raises(
        ValueError, match=r"^repeats must be a positive integer, got 0$"
    ):
        run_handoff_benchmarks(repeats=0, sizes=TINY)


def test_the_script_runs_its_options_and_writes_its_report(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(HandoffSizes, "quick", classmethod(lambda cls: TINY))
    path = tmp_path / "handoff.json"
    status = handoff.main(["--quick", "--repeats", "1", "--json", str(path)])
    out, err = capsys.readouterr()
    data = json.loads(path.read_text(encoding="utf-8"))
    # The exit status says whether the targets were met, as the report does.
    assert status == (0 if data["all_met"] else 1)
    assert (data["quick"], data["repeats"]) == (True, 1)
    assert data["sizes"] == {**attrs.asdict(TINY), "waiters": [3, 12]}
    assert [m["key"] for m in data["measurements"]] == [
        "contended",
        "uncontended",
        "scaling_3",
        "scaling_12",
        "scaling_growth",
        "memory",
    ]
    assert list(data["environment"]) == [
        "python",
        "trio",
        "trio_dispatch",
        "platform",
        "cpus",
    ]
    # The markdown goes to stdout (bench/reports/handoff.md), progress to stderr.
    assert out.startswith("Hand-off benchmarks: trio-dispatch ")
    assert ", quick run.\nMedians of 1 interleaved pairs;" in out
    assert sum(line.startswith("|") for line in out.splitlines()) == 6 + 4 + 4
    assert err.startswith("  warm-up\n")
    assert "  memory: pair 1/1\n" in err


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_the_script_refuses_a_bad_repeat_count_before_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    path = tmp_path / "handoff.json"
    with pytest.raises(SystemExit) as exit_:
        handoff.main(["--repeats", value, "--json", str(path)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith(
        f"error: argument --repeats: expected a positive integer, got {value!r}\n"
    )
    assert not path.exists()
