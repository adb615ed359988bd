"""The ``trio-dispatch`` command, end to end at small sizes."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
import trio
import trio.testing

import trio_dispatch
from trio_dispatch import DispatcherStatistics, ProviderStatistics
from trio_dispatch._cli import _commands, main
from trio_dispatch._cli._common import print_table, run_trio
from trio_dispatch._cli._demo import Progress
from trio_dispatch._cli._demo_command import progress_table
from trio_dispatch._cli._main import build_parser
from trio_dispatch.testing import CallsPerTurn, FairnessConfig

from .._helpers import PNG_MAGIC, cli_argv, run_cli


def block_imports(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``import name`` (and its submodules) fail, as if not installed."""
    for name in names:
        for loaded in [m for m in sys.modules if m.startswith(f"{name}.")]:
            monkeypatch.delitem(sys.modules, loaded)
        # None in sys.modules makes the import fail.
        monkeypatch.setitem(sys.modules, name, None)


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
        (
            ["simulate", "--agents", "-5"],
            "expected an integer from 1 to 100000, got '-5'",
        ),
        (
            ["simulate", "--agents", "many"],
            "expected an integer from 1 to 100000, got 'many'",
        ),
        (["simulate", "--limit", "0"], "expected an integer from 1 to 10000, got '0'"),
        (
            ["simulate", "--limit", "2.5"],
            "expected an integer from 1 to 10000, got '2.5'",
        ),
        (
            ["simulate", "--load", "0"],
            "expected a load above 0 and at most 10, got '0'",
        ),
        (
            ["simulate", "--load", "nan"],
            "expected a load above 0 and at most 10, got 'nan'",
        ),
        (
            ["simulate", "--calls", "5-2"],
            "1 <= LOW <= HIGH <= 100, such as 1-8, got '5-2'",
        ),
        (["simulate", "--policy", "lifo"], "invalid choice: 'lifo'"),
        (["demo", "--agents", "0"], "expected an integer from 1 to 1000, got '0'"),
        (
            ["demo", "--limit-openai", "-1"],
            "expected an integer from 1 to 100, got '-1'",
        ),
        (["demo", "--rate-limits", "2"], "expected a number from 0 to 1, got '2'"),
        (["bench", "everything"], "invalid choice: 'everything'"),
        (["bench", "handoff"], "invalid choice: 'handoff'"),
        (["bench", "http"], "invalid choice: 'http'"),
        (["bench", "all"], "invalid choice: 'all'"),
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
    assert len(err.splitlines()) == 1
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
    assert "1/2 oldest-first: 12 turns completed, 0 failed" in out
    assert "2/2 FIFO, same fleet: 12 turns completed, 0 failed" in out
    assert "never exceeded the limits, in either run" in out
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["complete"] is True
    limits = {"openai": 2, "anthropic": 1}
    for run in (report["oldest_first"], report["fifo"]):
        assert run["turns_completed"] == 12
        by_provider = {p["provider"]: p for p in run["providers"]}
        assert by_provider["openai"]["server_peak_in_flight"] <= 2
        assert by_provider["anthropic"]["server_peak_in_flight"] <= 1
        assert sum(p["turns"] for p in run["providers"]) == 12
        assert all(p["llm_calls"] >= p["turns"] for p in run["providers"])
        # The timeline (the dispatcher's events, or the FIFO limiter's):
        # within the limits, back to idle at the end.
        for name, points in run["timeline"].items():
            assert max(in_use for _, in_use, _ in points) == limits[name]
            assert points[-1][1:] == [0, 0]
            assert [t for t, _, _ in points] == sorted(t for t, _, _ in points)
        assert sorted(run["pauses"]) == ["anthropic", "openai"]
        assert sum(len(v) for v in run["turn_latencies"].values()) == 12
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
    console.print(progress_table(progress))
    rows = {
        cells[0]: cells[1:3]
        for line in console.export_text().splitlines()
        if len(cells := [cell.strip() for cell in line.split("│")[1:-1]]) > 2
    }
    assert rows["openai"] == ["4", "## 2"]
    assert rows["local"] == ["none", "## 2"]


# ------------------------------------------------------------------ bench


@pytest.fixture
def tiny_fairness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the real sweep, ``--quick``, at a size a test can afford."""

    def tiny() -> FairnessConfig:
        return FairnessConfig(
            loads=(0.9,),
            shapes=(CallsPerTurn(1, 3),),
            agents=40,
        )

    monkeypatch.setattr(FairnessConfig, "quick", staticmethod(tiny))


FAIRNESS_FILES = [
    "fairness.json",
    "fairness.md",
    "latency_vs_load.png",
    "latency_distribution.png",
]


@pytest.mark.usefixtures("tiny_fairness")
def test_bench_fairness_writes_its_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = run_cli(
        capsys, "bench", "fairness", "--quick", "--out", str(tmp_path)
    )
    assert status == 0
    assert "# Fairness benchmark" in out
    assert sorted(p.name for p in (tmp_path / "fairness").iterdir()) == sorted(
        FAIRNESS_FILES
    )
    fairness = json.loads((tmp_path / "fairness" / "fairness.json").read_text())
    assert fairness["config"]["agents"] == 40
    assert {row["metrics"]["policy"] for row in fairness["rows"]} == {
        "oldest-first",
        "fifo",
        "random",
        "none",
    }
    for name in ("latency_vs_load.png", "latency_distribution.png"):
        assert (tmp_path / "fairness" / name).read_bytes().startswith(PNG_MAGIC)
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()], "no staging files left"


def test_bench_offers_only_the_fairness_sweep(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The project's own micro-benchmarks live in bench/, outside the package.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: trio-dispatch bench [-h] [--quick]")
    # The choices, in the usage line and in the list of arguments.
    # (--policy's choices aside.)
    choices = [c for c in re.findall(r"\{(.*?)\}", help_text) if "fifo" not in c]
    assert choices == ["fairness", "fairness"]


# ------------------------------------------------------------------ serve-fake


def test_serve_fake_answers_on_loopback_until_terminated() -> None:
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
            response = httpx2.post(
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
    # SIGTERM still stops it at once, by the signal's default action.
    assert process.returncode == -signal.SIGTERM


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
    assert done.stderr.startswith(
        f"trio-dispatch serve-fake: error: cannot serve on 127.0.0.1:{port}: "
    )
    assert len(done.stderr.splitlines()) == 1
    assert done.stdout == ""


def test_serve_fake_refuses_an_empty_api_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Refused while parsing, before anything is served: such a server would
    # answer every request 401.
    for key in ("", " sk-x"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["serve-fake", "--api-key", key])
        assert exit_.value.code == 2
        _, err = capsys.readouterr()
        assert err == (
            "trio-dispatch serve-fake: error: argument --api-key: expected a"
            " non-empty key without leading or trailing whitespace"
            " (see trio-dispatch serve-fake --help)\n"
        )
    assert (
        build_parser().parse_args(["serve-fake", "--api-key", "sk-x"]).api_key == "sk-x"
    )


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    ("argv", "bound"),
    [
        (["demo", "--agents"], 1000),
        (["demo", "--turns"], 100),
        (["demo", "--max-calls"], 20),
        (["demo", "--limit-openai"], 100),
        (["demo", "--limit-anthropic"], 100),
        (["simulate", "--agents"], 100_000),
        (["simulate", "--limit"], 10_000),
        (["simulate", "--capacity"], 10_000),
        (["bench", "fairness", "--jobs"], 64),
    ],
)
def test_sizes_have_upper_bounds_stated_in_help(
    capsys: pytest.CaptureFixture[str], argv: list[str], bound: int
) -> None:
    *command, option = argv
    destination = option.removeprefix("--").replace("-", "_")
    assert getattr(build_parser().parse_args([*argv, str(bound)]), destination) == bound
    for too_big in (bound + 1, 10**12):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([*argv, str(too_big)])
        assert exit_.value.code == 2
        out, err = capsys.readouterr()
        prog = f"trio-dispatch {command[0]}"
        assert (out, err) == (
            "",
            f"{prog}: error: argument {option}: expected an integer from 1 to"
            f" {bound}, got '{too_big}' (see {prog} --help)\n",
        )
    with pytest.raises(SystemExit):
        build_parser().parse_args([command[0], "--help"])
    # argparse wraps help text; the bound is stated in the option's own help.
    help_text = " ".join(capsys.readouterr().out.split())
    metavar = option.removeprefix("--").upper().replace("-", "_")
    options = help_text.split("options:", 1)[1]
    described = options.split(f"{option} {metavar} ", 1)[1].split(" --", 1)[0]
    assert f"1 to {bound} (default" in described


def test_calls_per_turn_have_an_upper_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert build_parser().parse_args(["simulate", "--calls", "1-100"]).calls == (1, 100)
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["simulate", "--calls", "1-1000000000000"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "trio-dispatch simulate: error: argument --calls: expected calls per"
        " turn as LOW-HIGH with 1 <= LOW <= HIGH <= 100, such as 1-8,"
        " got '1-1000000000000' (see trio-dispatch simulate --help)\n"
    )


# ------------------------------------------------------------------ outputs


@pytest.fixture
def a_file_and_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("keep me")
    (tmp_path / "adir").mkdir()
    return tmp_path


def tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.usefixtures("tiny_fairness")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["simulate", "--json", "afile/x.json"],
            "cannot write afile/x.json: afile is not a directory",
        ),
        (
            ["simulate", "--json", "newdir/x.json", "--plot", "afile/p.png"],
            "cannot write afile/p.png: afile is not a directory",
        ),
        (
            ["simulate", "--plot", "afile/sub/deeper/p.png"],
            "cannot write afile/sub/deeper/p.png: afile is not a directory",
        ),
        (["simulate", "--json", "adir"], "cannot write adir: it is a directory"),
        (
            ["simulate", "--json", "newdir/m.out", "--plot", "newdir/../newdir/m.out"],
            "cannot write newdir/../newdir/m.out twice",
        ),
        (
            ["demo", "--out", "afile/sub"],
            "cannot write afile/sub/demo.json: afile is not a directory",
        ),
        (
            ["demo", "--out", "afile"],
            "cannot write afile/demo.json: afile is not a directory",
        ),
        (
            ["bench", "fairness", "--quick", "--out", "afile"],
            "cannot write afile/fairness: afile is not a directory",
        ),
        (
            ["bench", "fairness", "--quick", "--out", "newdir/afile"],
            "cannot write newdir/afile/fairness: newdir/afile is not a directory",
        ),
    ],
)
def test_outputs_are_checked_before_the_run_and_nothing_is_created(
    capsys: pytest.CaptureFixture[str],
    a_file_and_a_folder: Path,
    argv: list[str],
    message: str,
) -> None:
    if argv[-1] == "newdir/afile":
        (a_file_and_a_folder / "newdir").mkdir()
        (a_file_and_a_folder / "newdir" / "afile").write_text("keep me")
    before = tree(a_file_and_a_folder)
    status, out, err = run_cli(capsys, *argv, *(["--no-live"] * (argv[0] == "demo")))
    assert status == 2
    assert err == f"trio-dispatch {argv[0]}: error: {message}\n"
    assert out == "", "refused before the run"
    assert tree(a_file_and_a_folder) == before
    assert (a_file_and_a_folder / "afile").read_text() == "keep me"


def test_an_output_folder_that_is_not_writable_is_refused(
    capsys: pytest.CaptureFixture[str],
    a_file_and_a_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Faked: these tests may run as root, whom permissions do not stop.
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda path, mode: Path(path) != Path("adir") and real_access(path, mode),
    )
    for target in ("adir/x.json", "adir/new/x.json"):
        status, out, err = run_cli(capsys, "simulate", "--json", target)
        assert (status, out) == (2, "")
        assert err == (
            f"trio-dispatch simulate: error: cannot write {target}: adir is not writable\n"
        )
    assert tree(a_file_and_a_folder) == ["adir", "afile"]


def test_a_failed_write_is_one_line_and_leaves_nothing_behind(
    capsys: pytest.CaptureFixture[str],
    a_file_and_a_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(source: str, target: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    status, out, err = run_cli(
        capsys,
        "simulate",
        "--agents",
        "10",
        "--policy",
        "fifo",
        "--json",
        "new/sub/m.json",
    )
    assert status == 1
    assert "fifo" in out, "the run itself finished"
    assert err == (
        "trio-dispatch simulate: error: cannot write new/sub/m.json:"
        f" {os.strerror(errno.ENOSPC)}\n"
    )
    assert tree(a_file_and_a_folder) == ["adir", "afile"]


# ------------------------------------------------------------------ Ctrl+C


def interrupt_when_ready(
    argv: list[str], ready: str, *, settle: float = 0.0
) -> tuple[int, str]:
    """Start the command, SIGINT it once it prints ``ready``; status and stderr."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().startswith(ready)
            time.sleep(settle)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=60)
        finally:
            process.kill()
    return process.returncode, err


def test_ctrl_c_stops_serve_fake_with_one_line_and_status_130() -> None:
    status, err = interrupt_when_ready(
        cli_argv("serve-fake", "--port", "0"), "fake LLM server at http://"
    )
    assert err == "trio-dispatch: interrupted\n"
    assert status == 130


def test_ctrl_c_stops_a_running_demo_with_one_line_and_status_130(
    tmp_path: Path,
) -> None:
    # Sizes for hours of work; the header is printed just before the run,
    # and a moment later Ctrl+C lands inside it, among the agents' tasks.
    status, err = interrupt_when_ready(
        cli_argv(
            "demo",
            "--agents",
            "1000",
            "--turns",
            "100",
            "--no-live",
            "--out",
            str(tmp_path / "out"),
        ),
        "trio-dispatch demo: 1000 agents x 100 turns",
        settle=0.5,
    )
    assert err == "trio-dispatch: interrupted\n"
    assert status == 130
    assert list(tmp_path.iterdir()) == [], "an interrupted run writes nothing"


@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_cancels_the_run_even_where_a_task_would_swallow_it() -> None:
    # In a trio run with Ctrl+C as KeyboardInterrupt, a task that takes it
    # for its cue to stop (as hypercorn's serve does) leaves the rest of the
    # run going on.
    async def press_ctrl_c() -> None:
        signal.raise_signal(signal.SIGINT)
        await trio.sleep_forever()

    async def swallows_ctrl_c() -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(press_ctrl_c)
                await trio.sleep_forever()
        except BaseExceptionGroup as group:
            _, others = group.split(KeyboardInterrupt)
            if others is not None:
                raise others from None

    async def run() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(swallows_ctrl_c)
            await trio.sleep(3600)
            return trio.current_time()

    with pytest.raises(KeyboardInterrupt):
        run_trio(run, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.usefixtures("ctrl_c")
def test_a_second_ctrl_c_while_the_run_unwinds_changes_nothing() -> None:
    cleaned_up_at: list[float] = []

    async def presses_again_while_cleaning_up() -> None:
        try:
            signal.raise_signal(signal.SIGINT)
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                signal.raise_signal(signal.SIGINT)
                await trio.sleep(1)
                cleaned_up_at.append(trio.current_time())

    with pytest.raises(KeyboardInterrupt):
        run_trio(
            presses_again_while_cleaning_up,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
    assert cleaned_up_at == [1.0]


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    # As trio does: a background job that ignores SIGINT keeps ignoring it.
    async def press_ctrl_c_and_work_on() -> float:
        signal.raise_signal(signal.SIGINT)
        await trio.sleep(1)
        return trio.current_time()

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worked_until = run_trio(
            press_ctrl_c_and_work_on,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
    except KeyboardInterrupt:
        pytest.fail("an ignored Ctrl+C interrupted the run")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert worked_until == 1.0


# Ctrl+C raised from inside code we do not own, at a chosen moment: where
# trio's own Ctrl+C would raise KeyboardInterrupt, since that code runs.
CTRL_C_AS_HYPERCORN_LISTENS = """
import trio
listen = trio.serve_listeners
async def ctrl_c_then_listen(*args, **kwargs):
    signal.raise_signal(signal.SIGINT)
    return await listen(*args, **kwargs)
trio.serve_listeners = ctrl_c_then_listen
"""

CTRL_C_IN_A_FAKE_SERVER_RESPONSE = """
from trio_dispatch.testing._fake_server import FakeLLMServer
stream = FakeLLMServer._stream
async def ctrl_c_then_stream(self, *args, **kwargs):
    if not getattr(FakeLLMServer, "pressed", False):
        FakeLLMServer.pressed = True
        signal.raise_signal(signal.SIGINT)
    return await stream(self, *args, **kwargs)
FakeLLMServer._stream = ctrl_c_then_stream
"""


def test_ctrl_c_while_hypercorn_starts_listening_stops_serve_fake() -> None:
    # hypercorn took a KeyboardInterrupt in one of its tasks as its cue to
    # stop, and swallowed it: the server was gone and serve-fake slept on.
    done = subprocess.run(
        cli_argv("serve-fake", "--port", "0", setup=CTRL_C_AS_HYPERCORN_LISTENS),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == "trio-dispatch: interrupted\n"
    assert done.returncode == 130


def test_ctrl_c_while_a_fake_server_answers_stops_the_demo(tmp_path: Path) -> None:
    # hypercorn logged a KeyboardInterrupt in a request's handler as an
    # error in the application, and the demo went on for hours.
    done = subprocess.run(
        cli_argv(
            "demo",
            "--agents",
            "1000",
            "--turns",
            "100",
            "--no-live",
            "--out",
            str(tmp_path / "out"),
            setup=CTRL_C_IN_A_FAKE_SERVER_RESPONSE,
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == "trio-dispatch: interrupted\n"
    assert done.returncode == 130
    assert list(tmp_path.iterdir()) == [], "an interrupted run writes nothing"


def test_sigterm_still_ends_serve_fake() -> None:
    with subprocess.Popen(
        cli_argv(
            "serve-fake",
            "--port",
            "0",
            setup="signal.signal(signal.SIGTERM, signal.SIG_DFL)",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().startswith("fake LLM server at http://")
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
        finally:
            process.kill()
    assert process.returncode == -signal.SIGTERM


@pytest.mark.parametrize(
    "interrupt",
    [
        KeyboardInterrupt(),
        BaseExceptionGroup("nursery", [KeyboardInterrupt()]),
        BaseExceptionGroup(
            "outer", [BaseExceptionGroup("inner", [KeyboardInterrupt()])]
        ),
    ],
)
def test_an_interrupt_inside_exception_groups_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    interrupt: BaseException,
) -> None:
    def run(args: object) -> int:
        raise interrupt

    monkeypatch.setattr(_commands, "simulate_command", run)
    assert run_cli(capsys, "simulate") == (130, "", "trio-dispatch: interrupted\n")


def test_an_error_beside_an_interrupt_keeps_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = BaseExceptionGroup("nursery", [KeyboardInterrupt(), ValueError("bug")])

    def run(args: object) -> int:
        raise group

    monkeypatch.setattr(_commands, "simulate_command", run)
    with pytest.raises(BaseExceptionGroup) as raised:
        main(["simulate"])
    assert raised.value is group


# ------------------------------------------------------------------ optional packages


def test_plain_tables_line_up(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(
        None,
        "a title",
        ("policy", "p50", "done"),
        [("fifo", "1.5", "10"), ("oldest-first", "12.0", "9")],
    )
    assert capsys.readouterr().out == (
        "a title\n"
        "policy         p50  done\n"
        "fifo           1.5    10\n"
        "oldest-first  12.0     9\n"
    )


def test_simulate_needs_neither_rich_nor_matplotlib(tmp_path: Path) -> None:
    done = subprocess.run(
        cli_argv(
            "simulate",
            "--agents",
            "20",
            "--policy",
            "fifo",
            "--policy",
            "oldest-first",
            "--json",
            "m.json",
            without=("rich", "matplotlib"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stderr) == (0, "")
    title, header, *rows, against, better, worse, wrote = done.stdout.splitlines()
    assert title == (
        "20 turns of 1-8 calls, load 0.95, limit 8, seed 1; short turns: at"
        " most 3 calls (10 of 20) (virtual seconds)"
    )
    # What each policy completed, beside its latency.
    assert header.split()[:4] == ["policy", "done", "mean", "p50"]
    assert [row.split()[:2] for row in rows] == [
        ["fifo", "20/20"],
        ["oldest-first", "20/20"],
    ]
    assert all(len(row) == len(header) for row in rows), "aligned columns"
    assert against == "oldest-first against fifo:"
    assert better.startswith("  better: ")
    assert worse.startswith("  worse: ")
    assert wrote == "wrote m.json"
    assert sorted(json.loads((tmp_path / "m.json").read_text())) == [
        "fifo",
        "oldest-first",
    ]


def test_serve_fake_needs_no_rich() -> None:
    status, err = interrupt_when_ready(
        cli_argv("serve-fake", "--port", "0", without=("rich", "matplotlib")),
        "fake LLM server at http://",
    )
    assert (status, err) == (130, "trio-dispatch: interrupted\n")


@pytest.mark.usefixtures("tiny_fairness")
def test_bench_fairness_needs_no_rich(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    block_imports(monkeypatch, "rich")
    status, out, err = run_cli(
        capsys, "bench", "fairness", "--quick", "--out", str(tmp_path)
    )
    assert (status, err) == (0, "")
    assert out.startswith("# Fairness benchmark\n")
    assert out.endswith(
        "".join(f"wrote {tmp_path}/fairness/{name}\n" for name in FAIRNESS_FILES)
    )


DEMO_EXTRA = "needs the demo extra: pip install 'trio-dispatch[demo]'"
TESTING_EXTRA = "needs the testing extra: pip install 'trio-dispatch[testing]'"


@pytest.mark.usefixtures("tiny_fairness")
@pytest.mark.parametrize(
    ("missing", "argv", "message"),
    [
        ("rich", ["demo", "--agents", "2"], f"trio-dispatch demo {DEMO_EXTRA}"),
        ("matplotlib", ["demo", "--agents", "2"], f"trio-dispatch demo {DEMO_EXTRA}"),
        ("hypercorn", ["demo", "--agents", "2"], f"trio-dispatch demo {DEMO_EXTRA}"),
        (
            "matplotlib",
            ["simulate", "--agents", "10", "--plot", "p.png"],
            f"trio-dispatch simulate --plot {DEMO_EXTRA}",
        ),
        (
            "hypercorn",
            ["serve-fake", "--port", "0"],
            f"trio-dispatch serve-fake {TESTING_EXTRA}",
        ),
        (
            "matplotlib",
            ["bench", "fairness", "--quick"],
            f"trio-dispatch bench fairness {DEMO_EXTRA}",
        ),
    ],
)
def test_a_missing_package_names_its_extra_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    missing: str,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    block_imports(monkeypatch, missing)
    status, out, err = run_cli(capsys, *argv)
    assert (status, out, err) == (1, "", f"{message}\n")
    assert list(tmp_path.iterdir()) == []


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "--version")
    assert (status, out, err) == (0, f"trio-dispatch {trio_dispatch.__version__}\n", "")
