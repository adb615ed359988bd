"""Tests of ``bench/_model_server.py``: a model server started, ready, stopped.

The server is a stand-in for llama.cpp's (``tests/fixtures``), started as
the benchmark starts a real one, from its command line.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from .._bench import llama_server_stand_in, load_bench_script, process_gone

if TYPE_CHECKING:
    import pathlib


def test_the_server_command_gets_a_port_in_place_of_each_placeholder() -> None:
    server = load_bench_script("_model_server")
    command = "llama-server -m '/models/a b.gguf' --port {port} --alias=x:{port}"
    assert server.server_command(command, 8123) == [
        *("llama-server", "-m", "/models/a b.gguf"),
        *("--port", "8123", "--alias=x:8123"),
    ]


def test_a_started_server_is_stopped_however_the_block_ends(
    tmp_path: pathlib.Path,
) -> None:
    server = load_bench_script("_model_server")
    command, pid_file = llama_server_stand_in(tmp_path)
    port = load_bench_script("_common").free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        pytest.raises(RuntimeError, match=r"^the run failed$"),
        server.serving(server.server_command(command, port), url) as process,
    ):
        assert server.first_model(url) == "stand-in"
        assert int(pid_file.read_text(encoding="utf-8")) == process.pid
        raise RuntimeError("the run failed")
    assert process.returncode is not None
    assert process_gone(process.pid)


def test_a_server_that_exits_at_once_shows_its_output() -> None:
    server = load_bench_script("_model_server")
    command = [sys.executable, "-c", "import sys; sys.exit('no model file')"]
    with (
        pytest.raises(
            server.ServerUnavailable,
            match=r"^the server exited with status 1 before answering\n"
            r"its output ended with:\nno model file$",
        ),
        server.serving(command, "http://127.0.0.1:9"),
    ):
        pass  # pragma: no cover (never ready)


def test_a_command_that_cannot_run_is_said_so() -> None:
    server = load_bench_script("_model_server")
    with (
        pytest.raises(
            server.ServerUnavailable, match=r"^cannot run '/no/such/server': "
        ),
        server.serving(["/no/such/server"], "http://127.0.0.1:9"),
    ):
        pass  # pragma: no cover (never started)


def test_a_server_that_lingers_after_sigterm_is_killed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = load_bench_script("_model_server")
    monkeypatch.setattr(server, "STOP_SECONDS", 0.2)
    ready = tmp_path / "ready"
    # It ignores SIGTERM.
    program = (
        "import pathlib, signal, sys, time;"
        " signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", program, str(ready)], start_new_session=True
    )
    while not ready.exists():
        time.sleep(0.01)
    server.stop(process)
    assert process.returncode == -9
    assert process_gone(process.pid)
