"""A pool over two llmock servers: the official openai SDK, one key per member.

Usage (llmock is a third-party mock server, installed for this run only)::

    pip install llmock
    python bench/pool_llmock.py [--calls N] [--json PATH]

Two llmock instances (``llmock.main.create_app`` under uvicorn, each its
own process on a free loopback port, ``LLMOCK_LATENCY_MS=200``) are the
members ``key-a`` and ``key-b`` of the pool ``gpt`` (2 slots each). The
official ``openai`` SDK sends ``--calls`` streamed chat completions at
once through ``dispatcher.transport("gpt", endpoints=...)``, its own client
given a base URL that resolves nowhere and a key of its own; each member's
``Endpoint`` has the member's base URL and key (``sk-member-a``,
``sk-member-b``). Each instance writes the key of every model call it was
sent before llmock sees the request (``bench/_llmock_member.py``), and
llmock's own journal (``GET /_llmock/requests``) gives each call's start
and end, from which each instance's peak of calls at once is counted.

Issue 29's bar, checked: each instance saw only its own member's key (as
``Authorization: Bearer``), never the client's nor the other's; and, with
it, every call answered, each instance's calls those the dispatcher
granted on its member, and no instance above its member's limit. The exit
status is 1 if a bar is missed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import tempfile
import time
import urllib.request
from typing import TYPE_CHECKING, Any

import attrs
import httpx2
import openai
import trio

import trio_dispatch

from _common import (
    bars_and_machine,
    command_line,
    environment,
    finish,
    free_port,
    load_average,
)
from _model_server import serving

if TYPE_CHECKING:
    from collections.abc import Sequence

MEMBERS = {"key-a": "sk-member-a", "key-b": "sk-member-b"}
LIMIT = 2
CLIENT_KEY = "sk-the-clients-own"
MEMBER_SCRIPT = pathlib.Path(__file__).with_name("_llmock_member.py")


@attrs.frozen
class Instance:
    """What one llmock instance was sent."""

    member: str
    keys_seen: dict[str, int]
    calls: int
    granted: int
    peak_in_flight: int


@attrs.frozen
class LlmockReport:
    """The calls, each instance's keys and peak, the bars."""

    calls: int
    answered: int
    instances: list[Instance]
    bars: dict[str, bool]
    environment: dict[str, str] = attrs.field(
        factory=lambda: {**environment(httpx2=True), "openai": openai.__version__}
    )
    load: str = attrs.field(factory=load_average)

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    def to_markdown(self) -> str:
        lines = [
            f"{self.calls} streamed chat completions at once, the openai SDK through"
            f" the pool transport; two llmock instances of {LIMIT} slots each;"
            f" {self.answered} answered.",
            "",
            "| Member | Calls it was sent | Granted on it | Keys it saw | Peak at once |",
            "|---|--:|--:|---|--:|",
        ]
        for one in self.instances:
            keys = ", ".join(
                f"`{key}` x{count}" for key, count in one.keys_seen.items()
            )
            lines.append(
                f"| {one.member} | {one.calls} | {one.granted} | {keys}"
                f" | {one.peak_in_flight}/{LIMIT} |"
            )
        lines += [
            "",
            *bars_and_machine(self.bars, self.environment, self.load),
        ]
        return "\n".join(lines) + "\n"


def _peak(records: list[dict[str, Any]]) -> int:
    """The most of ``records`` (llmock's journal) under way at once."""
    moves = sorted(
        [(record["started_at"], 1) for record in records]
        + [(record["ended_at"], -1) for record in records]
    )
    peak = running = 0
    for _, move in moves:
        running += move
        peak = max(peak, running)
    return peak


def _journal(base: str) -> list[dict[str, Any]]:
    """The model calls llmock's journal holds, at ``base``."""
    with urllib.request.urlopen(f"{base}/_llmock/requests", timeout=10) as response:
        records: list[dict[str, Any]] = json.load(response)["requests"]
    return [r for r in records if r["path"].endswith("/chat/completions")]


async def _calls(bases: dict[str, str], calls: int) -> tuple[int, dict[str, int]]:
    """``calls`` streamed calls at once through the pool: how many were answered, grants."""
    answered = 0
    async with trio_dispatch.open_dispatcher(
        dict.fromkeys(MEMBERS, LIMIT), pools={"gpt": tuple(MEMBERS)}
    ) as dispatcher:
        endpoints = {
            member: trio_dispatch.Endpoint(f"{bases[member]}/v1", key)
            for member, key in MEMBERS.items()
        }
        async with httpx2.AsyncClient(
            transport=dispatcher.transport("gpt", endpoints=endpoints)
        ) as http:
            client = openai.AsyncOpenAI(
                api_key=CLIENT_KEY,
                base_url="http://pool.invalid/v1",
                http_client=http,
                max_retries=0,
            )

            async def one(index: int) -> None:
                nonlocal answered
                stream = await client.chat.completions.create(
                    model="gpt-4o-mini",
                    messages=[{"role": "user", "content": f"question {index}"}],
                    stream=True,
                )
                async with stream:
                    async for _ in stream:
                        pass
                answered += 1

            async with trio.open_nursery() as nursery:
                for index in range(calls):
                    nursery.start_soon(one, index)
        stats = dispatcher.statistics().providers
    return answered, {member: stats[member].granted_total for member in MEMBERS}


def run(calls: int) -> LlmockReport:
    """Start the two instances, send the calls, read what each was sent."""
    with tempfile.TemporaryDirectory() as folder:
        ports = {member: free_port() for member in MEMBERS}
        bases = {member: f"http://127.0.0.1:{port}" for member, port in ports.items()}
        files = {member: pathlib.Path(folder, f"{member}.keys") for member in MEMBERS}
        # Each instance's answers take 200 ms: calls overlap (its children inherit it).
        os.environ["LLMOCK_LATENCY_MS"] = "200"
        with contextlib.ExitStack() as servers:
            for member, port in ports.items():
                command = [
                    sys.executable,
                    str(MEMBER_SCRIPT),
                    str(port),
                    str(files[member]),
                ]
                servers.enter_context(serving(command, bases[member], timeout=60))
            answered, granted = trio.run(_calls, bases, calls)
            journals = {member: _journal(base) for member, base in bases.items()}
        instances = []
        for member in MEMBERS:
            lines = (
                files[member].read_text(encoding="ascii").splitlines()
                if files[member].exists()
                else []
            )
            seen: dict[str, int] = {}
            for key in lines:
                seen[key] = seen.get(key, 0) + 1
            instances.append(
                Instance(
                    member=member,
                    keys_seen=seen,
                    calls=len(lines),
                    granted=granted[member],
                    peak_in_flight=_peak(journals[member]),
                )
            )
    bars = {
        "each instance saw only its own member's key": all(
            set(one.keys_seen) == {f"Bearer {MEMBERS[one.member]}"} for one in instances
        ),
        "every call answered": answered == calls,
        "each instance's calls are those granted on its member": all(
            one.calls == one.granted for one in instances
        ),
        "no instance above its member's limit": all(
            one.peak_in_flight <= LIMIT for one in instances
        ),
    }
    return LlmockReport(calls, answered, instances, bars)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_line(__doc__)
    parser.add_argument("--calls", type=int, default=24)
    options = parser.parse_args(argv)
    started = time.perf_counter()
    report = run(options.calls)
    finish(report, json_path=options.json, started=started)
    return 0 if all(report.bars.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
