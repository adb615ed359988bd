"""From a trace file to FIFO, oldest-first and your configuration, in one command."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from trio_dispatch.testing import (
    CallsPerTurn,
    FairnessConfig,
    FairnessReport,
    FairnessRow,
    PoissonArrivals,
    SimProvider,
    Workload,
)

from .._helpers import PNG_MAGIC, run_cli

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """A mixed trace of 80 turns, short ones of tenant chat."""
    path = tmp_path / "mixed.jsonl"
    Workload(
        agents=80,
        arrivals=PoissonArrivals(0.95),
        providers=(SimProvider("provider", 2),),
        calls=CallsPerTurn.mixture(
            (0.8, CallsPerTurn(1, 2)), (0.2, CallsPerTurn(8, 12))
        ),
        tenants=(("chat", 4.0), ("agents", 1.0)),
        seed=5,
    ).write_trace(path)
    return path


def simulate_trace(
    capsys: pytest.CaptureFixture[str], trace: Path, *more: str
) -> tuple[int, str, str]:
    """``trio-dispatch simulate --trace TRACE --limit 2 MORE...``."""
    return run_cli(capsys, "simulate", "--trace", str(trace), "--limit", "2", *more)


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by policy (plain output, without rich)."""
    table = {}
    for line in out.splitlines():
        cells = [c for c in line.replace("│", " ").split() if c]
        if len(cells) > 2 and "/" in cells[1] and cells[0] != "wrote":
            table[cells[0]] = cells[1:]
    return table


def test_one_command_from_a_trace_to_fifo_oldest_first_and_yours(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    config = tmp_path / "mine.json"
    config.write_text(
        json.dumps(
            {
                "priority_aging": 600,
                "tenants": {"chat": {"weight": 4}},
                "limits": {"provider": {"initial": 2, "minimum": 1, "maximum": 2}},
            }
        ),
        encoding="utf-8",
    )
    metrics_path, plot_path = tmp_path / "m.json", tmp_path / "m.png"
    status, out, err = simulate_trace(
        capsys,
        trace,
        "--config",
        str(config),
        "--json",
        str(metrics_path),
        "--plot",
        str(plot_path),
    )
    assert (status, err) == (0, "")
    assert "80 turns of a trace, load " in out
    table = rows(out)
    assert list(table) == ["fifo", "oldest-first", "mine"]
    assert all(cells[0] == "80/80" for cells in table.values())
    assert "oldest-first against fifo:" in out
    assert "mine against fifo:" in out
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    assert sorted(metrics) == ["fifo", "mine", "oldest-first"]
    assert plot_path.read_bytes().startswith(PNG_MAGIC)


def test_a_trace_can_be_played_at_another_load_and_in_part(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    out_path = tmp_path / "m.json"
    status, out, _ = run_cli(
        capsys,
        "simulate",
        "--trace",
        str(trace),
        "--agents",
        "30",
        "--load",
        "0.5",
        "--policy",
        "fifo",
        "--json",
        str(out_path),
    )
    assert status == 0
    assert "30 turns of a trace, load 0.50, limit 8" in out
    assert json.loads(out_path.read_text())["fifo"]["turns"] == 30


def test_a_configuration_in_python_can_bring_its_own_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    module = tmp_path / "orders.py"
    module.write_text(
        "from trio_dispatch.testing import DispatcherConfig\n"
        "LEAST_SERVED = DispatcherConfig(key=lambda call: call.received)\n"
        "BOTH = {'a': DispatcherConfig(), 'b': DispatcherConfig({'priority_aging': 5})}\n",
        encoding="utf-8",
    )
    status, out, err = simulate_trace(
        capsys,
        trace,
        "--config",
        f"{module}:LEAST_SERVED",
        "--config",
        f"{module}:BOTH",
    )
    assert (status, err) == (0, "")
    assert list(rows(out)) == ["fifo", "oldest-first", "LEAST_SERVED", "a", "b"]


BAD_LINE = '{"started_at": 1, "calls": [{"duration": -1}]}'


@pytest.mark.parametrize("command", [["simulate"], ["bench", "fairness"]])
def test_a_bad_record_is_one_line_and_status_2_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"started_at": 0, "calls": [{"duration": 1}]}\n' + BAD_LINE + "\n")
    status, out, err = run_cli(capsys, *command, "--trace", "bad.jsonl")
    assert (status, out) == (2, "")
    assert err == (
        f"trio-dispatch {command[0]}: error: bad.jsonl, line 2: calls[0].duration"
        " must be a non-negative number of seconds, got -1\n"
    )
    assert list(tmp_path.iterdir()) == [path], "nothing written"


@pytest.mark.parametrize(
    "case",
    [
        (
            ["--trace", "missing.jsonl"],
            {},
            "cannot read missing.jsonl: No such file or directory",
        ),
        (
            ["--trace", "t.jsonl", "--calls", "1-3"],
            {"t.jsonl": '{"started_at": 0, "calls": [{"duration": 1}]}\n'},
            "--calls does not apply to a trace: its turns have their own",
        ),
        (
            ["--trace", "t.jsonl", "--agents", "5"],
            {"t.jsonl": '{"started_at": 0, "calls": [{"duration": 1}]}\n'},
            "--agents 5: the trace has only 1 turns",
        ),
        (
            ["--config", "c.json"],
            {"c.json": '{"priority_agin": 5}'},
            "c.json: 'priority_agin' is not an open_dispatcher option the"
            " simulator takes (it takes affinity_wait, budgets, default_pause,"
            " learn_budgets, limits, max_hold, max_pause, max_waiting,"
            " priority_aging, retry_grace, tenants, unknown_providers)",
        ),
        (
            ["--config", "c.json"],
            {"c.json": '{"priority_aging": -1}'},
            "c.json: priority_aging must be a positive number of seconds, got -1",
        ),
        (
            ["--config", "c.json"],
            {"c.json": '{"tenants": {"acme": {"weight": 0}}}'},
            "c.json: tenants.acme: weight must be a positive number, got 0",
        ),
        (
            ["--config", "c.json"],
            {"c.json": "[1]"},
            "c.json must hold a JSON object of open_dispatcher options",
        ),
        (
            ["--config", "nowhere"],
            {},
            "--config takes a JSON file or FILE.py:NAME or MODULE:NAME, got 'nowhere'",
        ),
        (
            ["--config", "m.py:NOPE"],
            {"m.py": "X = 1\n"},
            "m.py:NOPE must name a DispatcherConfig or a mapping of names to them, got NoneType",
        ),
    ],
)
def test_bad_traces_and_configurations_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[list[str], dict[str, str], str],
) -> None:
    argv, files, message = case
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    if "--trace" not in argv:
        argv = ["--agents", "5", *argv]
    status, out, err = run_cli(capsys, "simulate", *argv)
    assert (status, out) == (2, "")
    assert err == f"trio-dispatch simulate: error: {message}\n"


def test_a_sweep_of_ones_own_trace_reports_its_figures_and_no_target(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    trace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        FairnessConfig,
        "quick",
        staticmethod(lambda: FairnessConfig(loads=(0.5, 0.95), agents=40)),
    )
    status, out, err = run_cli(
        capsys,
        "bench",
        "fairness",
        "--quick",
        "--trace",
        str(trace),
        "--limit",
        "2",
        "--out",
        str(tmp_path / "out"),
    )
    assert (status, err) == (0, "")
    assert f"The turns of the trace `{trace.name}`" in out
    assert f"At 95% load with the trace {trace.name}, oldest-first's p95" in out
    assert "Target" not in out
    assert "`none` has no client-side limit" not in out
    assert "Random order" not in out
    report = FairnessReport.from_json(
        (tmp_path / "out" / "fairness" / "fairness.json").read_text(encoding="utf-8")
    )
    assert report.config.trace == str(trace)
    assert {(row.load, row.shape, row.policy) for row in report.rows} == {
        (load, trace.name, policy)
        for load in (0.5, 0.95)
        for policy in ("fifo", "oldest-first")
    }
    assert all(row.metrics.turns == 80 for row in report.rows)


def fixed_rows(shape: str) -> tuple[FairnessRow, ...]:
    from trio_dispatch.testing import PolicyMetrics  # noqa: PLC0415

    def metrics(policy: str, p95: float) -> PolicyMetrics:
        return PolicyMetrics(
            policy=policy, turns=10, completed=10, latency_mean=p95 / 2,
            latency_p50=1.0, latency_p95=p95, latency_p99=p95, latency_max=p95,
            slowdown_mean=1.0, slowdown_p95=1.0, fairness=1.0,
            first_wait_p95=0.0, max_slot_wait=0.0, utilisation=0.5,
            makespan=10.0, rejections=0,
        )  # fmt: skip

    return (
        FairnessRow(0.95, shape, metrics("oldest-first", 7.0), ()),
        FairnessRow(0.95, shape, metrics("fifo", 10.0), ()),
    )


def test_only_the_projects_own_sweep_is_held_to_its_target() -> None:
    own = FairnessReport(FairnessConfig.quick(), fixed_rows("1-8"))
    assert own.headline().endswith("Target (p95 <= 0.8x, mean below): met.")
    yours = FairnessReport(
        FairnessConfig(shapes=(CallsPerTurn(2, 3),), target_shape="2-3"),
        fixed_rows("2-3"),
    )
    assert yours.headline() == (
        "At 95% load with 2-3 calls per turn, oldest-first's p95 turn latency is"
        " 0.70x FIFO's (7.0 s against 10.0 s) and its mean 0.70x (3.5 s against"
        " 5.0 s)."
    )
