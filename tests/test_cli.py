"""The ``trio-dispatch`` command, end to end at small sizes."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import httpx
import pytest

import trio_dispatch.benchmarks
from trio_dispatch import DispatcherStatistics, ProviderStatistics
from trio_dispatch._cli import _progress_table, main
from trio_dispatch._demo import Progress
from trio_dispatch.benchmarks import FairnessConfig, HandoffSizes
from trio_dispatch.testing import CallsPerTurn

if TYPE_CHECKING:
    from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        status = main(list(argv))
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


# ------------------------------------------------------------------ simulate


def test_simulate_prints_every_policy_and_writes_json_and_plot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    json_path, plot_path = tmp_path / "out" / "m.json", tmp_path / "m.png"
    status, out, _ = run_cli(
        capsys,
        "simulate",
        "--agents",
        "60",
        "--load",
        "0.9",
        "--calls",
        "1-4",
        "--limit",
        "2",
        "--seed",
        "3",
        "--json",
        str(json_path),
        "--plot",
        str(plot_path),
    )
    assert status == 0
    for policy in ("oldest-first", "fifo", "random", "none"):
        assert policy in out
    metrics = json.loads(json_path.read_text())
    assert sorted(metrics) == ["fifo", "none", "oldest-first", "random"]
    assert metrics["oldest-first"]["turns"] == 60
    assert metrics["oldest-first"]["completed"] == 60
    assert plot_path.read_bytes().startswith(PNG_MAGIC)
    # Written whole, with the permissions any new file gets, not mkstemp's 0600.
    umask = os.umask(0)
    os.umask(umask)
    assert json_path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]


def test_simulate_is_deterministic(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in paths:
        status, _, _ = run_cli(
            capsys,
            "simulate",
            "--agents",
            "40",
            "--policy",
            "oldest-first",
            "--policy",
            "fifo",
            "--seed",
            "9",
            "--json",
            str(path),
        )
        assert status == 0
    assert paths[0].read_text() == paths[1].read_text()
    assert sorted(json.loads(paths[0].read_text())) == ["fifo", "oldest-first"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--agents", "-5"], "expected a positive integer, got '-5'"),
        (["simulate", "--agents", "many"], "expected a positive integer, got 'many'"),
        (["simulate", "--limit", "0"], "expected a positive integer, got '0'"),
        (["simulate", "--limit", "2.5"], "expected a positive integer, got '2.5'"),
        (
            ["simulate", "--load", "0"],
            "expected a load above 0 and at most 10, got '0'",
        ),
        (
            ["simulate", "--load", "nan"],
            "expected a load above 0 and at most 10, got 'nan'",
        ),
        (["simulate", "--calls", "5-2"], "1 <= LOW <= HIGH, such as 1-8, got '5-2'"),
        (["simulate", "--policy", "lifo"], "invalid choice: 'lifo'"),
        (["demo", "--agents", "0"], "expected a positive integer, got '0'"),
        (["demo", "--limit-openai", "-1"], "expected a positive integer, got '-1'"),
        (["demo", "--rate-limits", "2"], "expected a number from 0 to 1, got '2'"),
        (["bench", "everything"], "invalid choice: 'everything'"),
        (
            ["serve-fake", "--port", "70000"],
            "expected a port from 0 to 65535, got '70000'",
        ),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_options_exit_2_with_a_reason_and_write_nothing(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    status, out, err = run_cli(
        capsys, *argv, *(["--json", "x.json"] if argv[:1] == ["simulate"] else [])
    )
    assert status == 2
    assert message in err
    assert out == ""
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ demo


def test_demo_runs_a_fleet_over_http_within_the_limits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = run_cli(
        capsys,
        "demo",
        "--agents",
        "6",
        "--turns",
        "2",
        "--max-calls",
        "3",
        "--limit-openai",
        "2",
        "--limit-anthropic",
        "1",
        "--rate-limits",
        "0.1",
        "--seed",
        "4",
        "--no-live",
        "--out",
        str(tmp_path),
    )
    assert status == 0, out
    assert "12 turns completed, 0 failed" in out
    assert "never exceeded the limits" in out
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["turns_completed"] == 12
    by_provider = {p["provider"]: p for p in report["providers"]}
    assert by_provider["openai"]["server_peak_in_flight"] <= 2
    assert by_provider["anthropic"]["server_peak_in_flight"] <= 1
    assert sum(p["turns"] for p in report["providers"]) == 12
    assert all(p["llm_calls"] >= p["turns"] for p in report["providers"])
    assert (tmp_path / "demo.png").read_bytes().startswith(PNG_MAGIC)


def test_the_live_table_shows_a_limit_or_none_for_an_unlimited_provider() -> None:
    from rich.console import Console  # noqa: PLC0415 (the demo extra)

    def provider(name: str, limit: int | None) -> ProviderStatistics:
        return ProviderStatistics(
            provider=name,
            limit=limit,
            in_flight=2,
            waiting=0,
            paused=False,
            paused_until=None,
            granted_total=2,
            released_total=0,
            withdrawn_total=0,
            rejected_total=0,
            peak_in_flight=2,
            peak_waiting=0,
        )

    progress = Progress(
        turns_total=1,
        statistics=DispatcherStatistics(
            providers={
                "openai": provider("openai", 4),
                "local": provider("local", None),
            },
            closed=False,
        ),
    )
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(_progress_table(progress))
    rows = {
        cells[0]: cells[1:3]
        for line in console.export_text().splitlines()
        if len(cells := [cell.strip() for cell in line.split("│")[1:-1]]) > 2
    }
    assert rows["openai"] == ["4", "## 2"]
    assert rows["local"] == ["none", "## 2"]


# ------------------------------------------------------------------ bench


@pytest.fixture
def tiny_benchmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the real benchmark code at sizes a test can afford."""
    handoff = trio_dispatch.benchmarks.run_handoff_benchmarks
    http = trio_dispatch.benchmarks.run_http_benchmark
    tiny_sizes = HandoffSizes(
        tasks=6,
        cycles=3,
        limit=2,
        round_trips=20,
        waiters=(3, 12),
        min_grants=12,
        memory_waiters=40,
    )

    def tiny_handoff(**options: Any) -> Any:  # noqa: ANN401 (passes through)
        return handoff(**{**options, "sizes": tiny_sizes, "repeats": 1})

    def tiny_http(**options: Any) -> Any:  # noqa: ANN401 (passes through)
        return http(**{**options, "calls": 4, "warmup": 1})

    def tiny_fairness() -> FairnessConfig:
        return FairnessConfig(
            loads=(0.9,),
            shapes=(CallsPerTurn(1, 3),),
            agents=40,
        )

    monkeypatch.setattr(
        trio_dispatch.benchmarks, "run_handoff_benchmarks", tiny_handoff
    )
    monkeypatch.setattr(trio_dispatch.benchmarks, "run_http_benchmark", tiny_http)
    monkeypatch.setattr(FairnessConfig, "quick", staticmethod(tiny_fairness))


@pytest.mark.usefixtures("tiny_benchmarks")
def test_bench_all_writes_every_result(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = run_cli(capsys, "bench", "all", "--quick", "--out", str(tmp_path))
    # Tiny sizes may miss the hand-off targets; the status says so (0 or 1).
    assert status in (0, 1)
    assert "Contended hand-off" in out
    handoff = json.loads((tmp_path / "handoff" / "handoff.json").read_text())
    assert handoff["measurements"]
    assert (
        (tmp_path / "handoff" / "handoff.md")
        .read_text()
        .startswith("Hand-off benchmarks")
    )
    assert json.loads((tmp_path / "http" / "http.json").read_text())
    fairness = json.loads((tmp_path / "fairness" / "fairness.json").read_text())
    assert {row["metrics"]["policy"] for row in fairness["rows"]} == {
        "oldest-first",
        "fifo",
        "random",
        "none",
    }
    for name in ("latency_vs_load.png", "latency_distribution.png"):
        assert (tmp_path / "fairness" / name).read_bytes().startswith(PNG_MAGIC)
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()], "no staging files left"


# ------------------------------------------------------------------ serve-fake


def test_serve_fake_answers_on_loopback_until_interrupted() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "trio_dispatch._cli", "serve-fake", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            first = process.stdout.readline()
            assert first.startswith("fake LLM server at http://127.0.0.1:")
            base_url = first.split(" at ", 1)[1].strip()
            response = httpx.post(
                f"{base_url}/v1/chat/completions",
                headers={"Authorization": "Bearer sk-test"},
                json={
                    "model": "m",
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                },
                timeout=10,
            )
            assert response.status_code == 200
            assert "data: [DONE]" in response.text
        finally:
            process.terminate()
            process.wait(timeout=10)


def test_serve_fake_on_a_port_in_use_exits_2() -> None:
    # In a child process: hypercorn leaves its socket open when bind fails.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "trio_dispatch._cli",
                "serve-fake",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert f"cannot serve on 127.0.0.1:{port}:" in done.stderr
    assert done.stdout == ""
