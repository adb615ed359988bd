"""Smoke tests of ``bench/self_hosted.py``: the fake server's run, and a real one's.

Against the fake server, virtual time and seeded arrivals make the fixed
limits' figures repeatable (a learned limit's vary a little with trio's
shuffled scheduling, so it is held to bounds); a short run checks what
holds at any length: a limit at or
below the server's slots never fills its queue nor lets a younger turn
overtake, one above it does, the latency limit keeps the queue near empty
with the best fixed limit's throughput, and the server's metrics keep it
empty.

Against a real server, the figures are the clock's: a stand-in for
llama.cpp's server, started through ``--server-command``, checks the
command line, the server's start and stop, and that every row is measured,
not what the figures are.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from .._bench import llama_server_stand_in, load_bench_script, process_gone

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


def test_a_real_server_is_given_by_its_command_or_its_url() -> None:
    bench = load_bench_script("self_hosted")
    args = bench.parse_arguments(["--server-command", "srv --port {port}"])
    assert (args.server_command, args.server_url, args.metrics_url) == (
        "srv --port {port}",
        None,
        None,
    )
    args = bench.parse_arguments(
        ["--server-url", "http://127.0.0.1:8000/", "--model", "m", "--sweep", "4, 8"]
    )
    assert (args.server_url, args.model, args.sweep) == (
        "http://127.0.0.1:8000",
        "m",
        (4, 8),
    )
    # A command with a fixed port says where it listens.
    args = bench.parse_arguments(
        ["--server-command", "srv --port 9000", "--server-url", "http://h:9000"]
    )
    assert args.server_url == "http://h:9000"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--server-command", "srv"], "--server-command needs a {port} placeholder"),
        (["--server-command", " "], "--server-command must not be empty"),
        (["--model", "m"], "--model needs --server-command or --server-url"),
        (["--metrics-url", "http://h/metrics"], "--metrics-url needs"),
        (["--server-url", "ftp://h"], "expected an http:// or https:// URL"),
        (["--sweep", "2,0"], "expected a positive integer"),
    ],
)
def test_what_cannot_work_is_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench_script("self_hosted")
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_arguments(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_real_server_is_measured_through_its_command(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("self_hosted")
    command, pid_file = llama_server_stand_in(tmp_path)
    path = tmp_path / "real.json"
    status = bench.main(
        [
            *("--server-command", command),
            *("--seconds", "3", "--sweep", "2", "--calibration-limit", "4"),
            *("--json", str(path)),
        ]
    )
    assert status == 0
    report = json.loads(path.read_text(encoding="utf-8"))
    config = report["config"]
    assert config["model"] == "stand-in"
    assert config["metrics_url"] == f"{config['server_url']}/metrics"
    assert config["capacity_calls_per_second"] > 0
    rows = {row["limit"]: row for row in report["rows"]}
    assert list(rows) == [
        "64",
        "2",
        "adaptive (latency)",
        "adaptive (latency) + server metrics",
    ]
    for row in rows.values():
        assert row["calls_per_second"] > 0
        assert row["failed"] == 0
    # 64 at once is more than the stand-in's one slot: it queued some.
    assert rows["64"]["server_waiting_mean"] > 0
    assert rows["adaptive (latency)"]["limit_median"] is not None
    # The dropped first request was sent again, and counted.
    assert config["calibration"]["retried"] == 1
    assert set(config["load_averages"]) == set(rows)
    assert process_gone(int(pid_file.read_text()))
