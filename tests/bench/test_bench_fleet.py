"""Smoke test of ``bench/fleet.py`` at its ``--quick`` size.

Two tiny levels against the paced server in its own process: the report's
structure, and that every stream completed and was measured; never whether
a level was carried, which depends on how busy the machine is.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import TYPE_CHECKING

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    from types import ModuleType

BENCH = pathlib.Path(__file__).resolve().parent.parent.parent / "bench"


def load_bench() -> ModuleType:
    return load_bench_script("fleet")


def test_quick_run_measures_every_stream_of_each_level(tmp_path: pathlib.Path) -> None:
    bench = load_bench()
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "fleet.json").read_text(encoding="utf-8"))
    assert report["client"] == "ours"
    levels = report["levels"]
    streams = [level["streams"] for level in levels]
    # A level the server could not keep pace with ends the run early.
    assert streams == list(bench.QUICK_LEVELS)[: len(streams)]
    assert streams
    # A run that stopped before its last level says why; a server that fell
    # behind at the last level is said too, though every level ran.
    if len(streams) < len(bench.QUICK_LEVELS):
        assert report["inconclusive"] is not None
    if report["inconclusive"] is not None:
        assert report["inconclusive"].startswith(f"at {streams[-1]} streams")
    timing = report["timing"]
    for level in levels:
        assert level["failed"] == 0
        # At most window * rate tokens of each stream are due in the window
        # (one more at its edge); fewer if a stream started late.
        most = level["streams"] * (timing["window"] * timing["rate"] + 1)
        assert 0 < level["tokens"] <= most
        for key in ("late_p50_ms", "late_p99_ms", "late_max_ms", "server_p99_ms"):
            assert math.isfinite(level[key])
        assert level["late_p50_ms"] <= level["late_p99_ms"] <= level["late_max_ms"]
        assert level["cpu_share"] > 0
        assert level["cpu_us_per_token"] == pytest.approx(
            1e6 * level["cpu_share"] / (level["streams"] * timing["rate"])
        )
        assert level["server_cpu_share"] >= 0
        assert level["carried"] == (level["late_p99_ms"] <= report["threshold_ms"])
    assert report["carried"] == max(
        (level["streams"] for level in levels if level["carried"]), default=0
    )
    markdown = (tmp_path / "fleet.md").read_text(encoding="utf-8")
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(levels)
    assert f"**One process carries {report['carried']:,} concurrent streams**" in (
        markdown
    )


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("rate", r"^rate must be a positive number, got 0$"),
        ("window", r"^window must be a positive number, got 0$"),
    ],
)
def test_a_timing_without_time_is_refused(field: str, message: str) -> None:
    bench = load_bench()
    values = {"rate": 50.0, "stagger": 1.0, "warmup": 1.0, "window": 1.0, field: 0}
    with pytest.raises(ValueError, match=message):
        bench.Timing(**values)


def test_bad_search_bounds_are_refused_before_the_server_starts() -> None:
    bench = load_bench()
    timing = bench.Timing(rate=50.0, stagger=1.0, warmup=1.0, window=1.0)
    with pytest.raises(ValueError, match=r"^start must be a positive integer, got 0$"):
        bench.run(timing=timing, start=0)
    with pytest.raises(
        ValueError, match=r"^threshold_ms must be a positive number, got -1$"
    ):
        bench.run(timing=timing, threshold_ms=-1)
    with pytest.raises(
        ValueError, match=r"^client must be one of ours, minimal, got 'sdk'$"
    ):
        bench.run(timing=timing, client="sdk")
