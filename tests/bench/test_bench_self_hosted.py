"""Smoke test of ``bench/self_hosted.py``: a short run of every kind of limit.

Virtual time and seeded arrivals make the figures repeatable; a short run
checks what holds at any length: a limit at or below the server's slots
never fills its queue nor lets a younger turn overtake, one above it does,
the latency limit keeps the queue near empty with the best fixed limit's
throughput, and the server's metrics keep it empty.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib


def test_each_limit_is_measured_against_the_same_arrivals(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("self_hosted")
    path = tmp_path / "self_hosted.json"
    status = bench.main(["--quick", "--seconds", "180", "--json", str(path)])
    report = json.loads(path.read_text(encoding="utf-8"))
    rows = {row["limit"]: row for row in report["rows"]}
    assert list(rows) == [
        "64",
        "2",
        "4",
        "6",
        "8",
        "12",
        "adaptive (latency)",
        "adaptive (latency) + server metrics",
    ]
    for name in ("2", "4", "6"):
        assert rows[name]["server_waiting_mean"] == 0
        assert rows[name]["overtaken_share"] == 0
    for name in ("8", "12", "64"):
        assert rows[name]["server_waiting_mean"] > 0.5
        assert rows[name]["overtaken_share"] > 0.1
    assert rows["64"]["server_waiting_mean"] > rows["8"]["server_waiting_mean"]
    adaptive = rows["adaptive (latency)"]
    targets = report["targets"]
    assert adaptive["server_waiting_mean"] == targets["server_waiting_mean"] <= 1
    assert targets["throughput_vs_best"] >= 0.95
    assert adaptive["limit_median"] in {6, 7}
    # With the server's metrics, its queue stays ours.
    with_metrics = rows["adaptive (latency) + server metrics"]
    assert with_metrics["server_queue_share"] < 0.05
    assert with_metrics["overtaken_share"] < 0.05
    assert targets["metrics_throughput_vs_best"] >= 0.95
    assert status == (0 if report["met"] else 1)
