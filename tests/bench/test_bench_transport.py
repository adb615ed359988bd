"""The transport latency benchmark (``bench/transport_latency.py``), tiny.

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

    # mypy reads bench/transport_latency.py itself (bench/ is among its files).
    import transport_latency
else:
    transport_latency = load_bench_script("transport_latency")

run_transport_benchmark = transport_latency.run_transport_benchmark

LATENCY_FIELDS = {
    "direct_p50",
    "direct_p99",
    "through_p50",
    "through_p99",
    "added_p50",
    "added_p99",
    "added_paired_median",
}

# The openai SDK leaves the async generators under a stream unclosed when it
# stops at ``[DONE]``, with or without the transport.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.:ResourceWarning"
)


def test_the_transport_benchmark_runs_tiny_and_reports_both_paths() -> None:
    report = run_transport_benchmark(calls=3, warmup=1)
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert (data["calls"], data["warmup"], data["limit"]) == (3, 1, 8)
    for measure in ("first_chunk", "stream_end"):
        assert set(data[measure]) == LATENCY_FIELDS
        latency = getattr(report, measure)
        assert latency.added_p50 == pytest.approx(
            latency.through_p50 - latency.direct_p50
        )
    table = report.to_markdown().splitlines()
    assert table[-2].startswith("| Time to first chunk |")
    assert table[-1].startswith("| Time to stream end |")


def test_the_transport_benchmark_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match=r"^calls must be a positive integer, got 0$"):
        run_transport_benchmark(calls=0)
    with pytest.raises(
        ValueError, match=r"^warmup must be a non-negative integer, got -1$"
    ):
        run_transport_benchmark(warmup=-1)
    with pytest.raises(ValueError, match=r"^limit must be a positive integer, got 0$"):
        run_transport_benchmark(limit=0)


def test_the_script_runs_as_a_command_and_writes_its_report(tmp_path: Path) -> None:
    path = tmp_path / "transport.json"
    python_path = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "transport_latency.py"),
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
    assert set(data["first_chunk"]) == set(data["stream_end"]) == LATENCY_FIELDS
    assert list(data["environment"]) == [
        "python",
        "trio",
        "httpx2",
        "openai",
        "trio_dispatch",
        "platform",
        "cpus",
    ]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        "Latency added by dispatcher.transport() per openai SDK call:"
    )
    assert lines[1].startswith("2 calls per path against the fake LLM server")
    assert lines[-2].startswith("| Time to first chunk |")
    assert lines[-1].startswith("| Time to stream end |")
    assert done.stderr.startswith("  warm-up: 0 calls per path\n")


def test_the_script_refuses_bad_counts_before_running(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "transport.json"
    with pytest.raises(SystemExit) as exit_:
        transport_latency.main(["--calls", "0", "--json", str(path)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith(
        "error: argument --calls: expected a positive integer, got '0'\n"
    )
    assert not path.exists()
