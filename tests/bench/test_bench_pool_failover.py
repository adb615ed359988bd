"""Smoke test of ``bench/pool_failover.py``: a short real-time run, its report, and its bars.

Real sockets, real time: only what holds however busy the machine is gets
asserted (no turn fails; while key-b's server is down it is sent no more
than the calls that take it out and its probes), not the timings.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib


def test_a_short_run_loses_no_turn_and_rests_the_killed_member(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("pool_failover")
    path = tmp_path / "failover.json"
    bench.main(["--seconds", "8", "--json", str(path)])
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["turns"] > 0
    assert report["failed"] == 0
    assert report["answered"] == report["turns"]
    assert report["calls_sent"] >= report["answered"]
    assert report["answered_by_a"] + report["answered_by_b"] >= report["answered"]
    assert report["bars"][
        "while key-b is down, only the calls that take it out and its probes"
        " go to it (each then to key-a)"
    ]
    assert report["sent_to_b_while_down"] <= (
        bench.THRESHOLD + report["probes_while_down"]
    )
    states = [change["state"] for change in report["changes"]]
    assert set(states) <= {"out", "half_open", "in"}
    # Each move follows the one before it.
    for before, after in itertools.pairwise(states):
        assert (before, after) in {
            ("out", "half_open"),
            ("half_open", "in"),
            ("half_open", "out"),
            ("in", "out"),
        }
