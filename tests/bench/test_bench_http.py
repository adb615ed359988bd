"""The HTTP latency benchmark (``bench/http_latency.py``), tiny.

Its structure, never its timings: timings on a shared machine are not a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from .._bench import BENCH, ROOT, load_bench_script

if TYPE_CHECKING:
    from pathlib import Path

    import http_latency

    # mypy reads bench/ itself (it is among its files).
    import _common
else:
    _common = load_bench_script("_common")
    http_latency = load_bench_script("http_latency")

AddedLatency = _common.AddedLatency
run_http_benchmark = http_latency.run_http_benchmark

LATENCY_FIELDS = {
    "direct_p50",
    "direct_p99",
    "through_p50",
    "through_p99",
    "added_p50",
    "added_p99",
    "added_paired_median",
}


def test_the_http_benchmark_runs_tiny_and_reports_both_paths() -> None:
    report = run_http_benchmark(calls=3, warmup=1)
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert (data["calls"], data["warmup"], data["limit"]) == (3, 1, 8)
    for measure in ("first_event", "stream_end"):
        assert set(data[measure]) == LATENCY_FIELDS
        latency: _common.AddedLatency = getattr(report, measure)
        assert latency.added_p50 == pytest.approx(
            latency.through_p50 - latency.direct_p50
        )
    table = report.to_markdown().splitlines()
    assert table[-2].startswith("| Time to first event |")
    assert table[-1].startswith("| Time to stream end |")


def test_the_http_benchmark_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match=r"^calls must be a positive integer, got 0$"):
        run_http_benchmark(calls=0)
    with pytest.raises(
        ValueError, match=r"^warmup must be a non-negative integer, got -1$"
    ):
        run_http_benchmark(warmup=-1)
    with pytest.raises(ValueError, match=r"^limit must be a positive integer, got 0$"):
        run_http_benchmark(limit=0)
    with pytest.raises(ValueError, match=r"^samples must come in pairs, at least one$"):
        AddedLatency.from_samples([], [])
    with pytest.raises(ValueError, match=r"^samples must come in pairs, at least one$"):
        AddedLatency.from_samples([1.0, 2.0], [1.0])


def test_paired_summaries_use_the_interpolated_percentiles() -> None:
    # Seconds in, microseconds out; p99 of two samples lies 99% of the way up.
    latency = AddedLatency.from_samples([0.001, 0.003], [0.002, 0.005])
    assert latency.direct_p50 == pytest.approx(2000)
    assert latency.direct_p99 == pytest.approx(2980)
    assert latency.through_p50 == pytest.approx(3500)
    assert latency.through_p99 == pytest.approx(4970)
    assert latency.added_p50 == pytest.approx(1500)
    assert latency.added_p99 == pytest.approx(1990)
    # The pairs differ by 1 ms and 2 ms.
    assert latency.added_paired_median == pytest.approx(1500)


def test_the_script_runs_as_a_command_and_writes_its_report(tmp_path: Path) -> None:
    # A fresh interpreter, started elsewhere, as a user runs it; PYTHONPATH
    # names this checkout, whatever copy of the package is installed.
    path = tmp_path / "http.json"
    python_path = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "http_latency.py"),
            "--calls",
            "2",
            "--warmup",
            "0",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": python_path},
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(path.read_text(encoding="utf-8"))
    assert (data["calls"], data["warmup"], data["limit"]) == (2, 0, 8)
    assert set(data["first_event"]) == set(data["stream_end"]) == LATENCY_FIELDS
    assert list(data["environment"]) == [
        "python",
        "trio",
        "httpx2",
        "trio_dispatch",
        "platform",
        "cpus",
    ]
    # The markdown goes to stdout (bench/reports/http.md), progress to stderr.
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Latency added by the dispatcher per LLM call:")
    assert lines[1].startswith("2 calls per path against the fake LLM server")
    assert lines[-2].startswith("| Time to first event |")
    assert lines[-1].startswith("| Time to stream end |")
    assert done.stderr.startswith("  warm-up: 0 calls per path\n")


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--calls", "0", "a positive integer"),
        ("--calls", "many", "a positive integer"),
        ("--warmup", "-1", "a non-negative integer"),
    ],
)
def test_the_script_refuses_bad_counts_before_running(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    option: str,
    value: str,
    expected: str,
) -> None:
    path = tmp_path / "http.json"
    with pytest.raises(SystemExit) as exit_:
        http_latency.main([option, value, "--json", str(path)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith(
        f"error: argument {option}: expected {expected}, got {value!r}\n"
    )
    assert not path.exists()
