"""A model server for a benchmark: started from its command line, ready, stopped.

``serving(command, url)`` runs a server (llama.cpp's ``llama-server``, a
vLLM, any with an HTTP health check) for the length of a ``with`` block:
it waits until the server answers, and stops it however the block ends.
``server_command`` puts a free port in its command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

READY_SECONDS: Final = 300.0
"""How long a started server may take to answer (loading its model)."""

STOP_SECONDS: Final = 10.0
"""How long a started server is given to exit after SIGTERM, before SIGKILL."""


class ServerUnavailable(Exception):
    """The server did not start, or does not answer."""


def server_command(command: str, port: int) -> list[str]:
    """``command`` split as a shell would, with ``port`` in place of every ``{port}``."""
    return [arg.replace("{port}", str(port)) for arg in shlex.split(command)]


def _status(url: str) -> int | None:
    """The status of ``GET url``, or ``None`` with no answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        exc.close()  # its body, unread
        return exc.code
    except OSError:  # refused, reset, timed out: not listening yet
        return None


def wait_until_ready(
    url: str, process: subprocess.Popen[bytes] | None = None, *, timeout: float
) -> None:
    """Wait until the server at ``url`` answers ``/health`` (or ``/v1/models``) 200.

    Raises:
        ServerUnavailable: ``process`` exited first, or ``timeout`` passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        health = _status(f"{url}/health")
        if health == 200 or (health == 404 and _status(f"{url}/v1/models") == 200):
            return
        if process is not None and process.poll() is not None:
            raise ServerUnavailable(
                f"the server exited with status {process.returncode} before answering"
            )
        if time.monotonic() > deadline:
            raise ServerUnavailable(
                f"{url} did not answer /health with 200 within {timeout:g} s"
                f" (last: {health})"
            )
        time.sleep(0.2)


def first_model(url: str) -> str:
    """The first model the server at ``url`` lists at ``/v1/models``."""
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
            models = json.load(response)
        return str(models["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ServerUnavailable(
            f"cannot read a model's name from {url}/v1/models ({exc}): give --model"
        ) from None


@contextlib.contextmanager
def serving(
    command: Sequence[str], url: str, *, timeout: float = READY_SECONDS
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` until the block ends, once the server at ``url`` is ready.

    Its output goes to a temporary file, whose end the error shows if it
    never gets ready. It runs in a process group of its own, which is sent
    SIGTERM at the end, and SIGKILL if it has not exited ``STOP_SECONDS``
    later, whatever ends the block (an error, Ctrl+C).

    Raises:
        ServerUnavailable: The command cannot be run, exits before it
            answers, or does not answer within ``timeout``.
    """
    with tempfile.TemporaryFile() as log:
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerUnavailable(f"cannot run {command[0]!r}: {exc}") from None
        try:
            try:
                wait_until_ready(url, process, timeout=timeout)
            except ServerUnavailable as exc:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-15:]
                raise ServerUnavailable(
                    "\n".join([str(exc), "its output ended with:", *tail])
                ) from None
            yield process
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's group; SIGKILL to what is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_SECONDS)
    # The leader lingering, or what it started, still in its group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
