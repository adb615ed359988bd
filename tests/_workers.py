"""Whole OS processes as members of a fleet, for the shared-backend tests.

A worker runs ``python -m <module> <settings as JSON>`` from the
repository's root, reports JSON lines on stdout, and, if asked for, hears
lines on stdin. Killed when the block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT = pathlib.Path(__file__).parent.parent


class Worker:
    """A fleet process: JSON lines out on stdout, lines in on stdin."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""

    async def line(self) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        while b"\n" not in self._buffer:
            chunk = await stdout.receive_some()
            if not chunk:
                raise AssertionError(f"the worker ended: {self.process.returncode}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        result: dict[str, Any] = json.loads(line)
        return result

    async def tell(self) -> None:
        """Send a line (a worker started with ``stdin=True``)."""
        stdin = self.process.stdin
        assert stdin is not None
        # A worker that has done its work and ended has nothing left to hear.
        with contextlib.suppress(trio.BrokenResourceError):
            await stdin.send_all(b"\n")


@asynccontextmanager
async def worker(
    module: str,
    *,
    stdin: bool = False,
    **settings: Any,  # noqa: ANN401  # JSON values
) -> AsyncIterator[Worker]:
    """A worker running ``module`` with ``settings``, killed at the end."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", module, json.dumps(settings)],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    try:
        yield Worker(process)
    finally:
        process.kill()
        with trio.move_on_after(5, shield=True):
            await process.wait()
