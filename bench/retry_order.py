"""The order turns are served in when the oldest one meets a 429.

Usage::

    python bench/retry_order.py [--runs N] [--json PATH]

Prints, for each way of calling, how often the provider served the three
turns oldest first (``A B C``) and what it served otherwise, as a markdown
table on stdout (progress goes to stderr). With ``--json``, writes the
report to ``PATH``. Needs the ``testing`` extra (hypercorn) and the
``openai`` and ``anthropic`` SDKs. The report in ``bench/reports/`` comes
from::

    python bench/retry_order.py --runs 10 --json bench/reports/retry_order.json > bench/reports/retry_order.md

Each run, on real sockets and in real time, in a ``trio.run`` of its own:
the fake LLM server on loopback, a dispatcher limiting the provider to 1,
and three turns, each one call. Turn A starts first; its call is answered
after 0.2 s with 429 and ``Retry-After: 1``. Turns B and C start once A's
request has reached the server, so they wait while A holds the slot and
then through the pause. The order is the order in which the server
received the calls it answered 200. The ways of calling:

* ``openai SDK in turn()`` and ``anthropic SDK in turn()``: the official
  SDK, its own retries on, on an ``httpx2.AsyncClient`` whose transport is
  ``dispatcher.transport(provider)``, each call inside
  ``dispatcher.turn()``;
* ``openai SDK, no turn()``: the same without ``turn()``, where each
  request, a retry too, is a turn of its own, ranked when it asks;
* ``conversation``: ``start_conversation`` with ``OpenAIProvider``, whose
  retry of a rate limit waits in the queue.
"""

from __future__ import annotations

import collections
import gc
import json
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Final, final

import anthropic
import attrs
import httpx2
import openai
import trio

from trio_dispatch import open_dispatcher
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    Fault,
    open_fake_llm_server,
)

from _common import (
    command_line,
    count,
    count_option,
    environment,
    finish,
    plain,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trio_dispatch import Dispatcher
    from trio_dispatch.testing import FakeLLMServer, FakeRequest

#: The ways of calling, in the report's order.
PATHS: Final = (
    "openai SDK in turn()",
    "anthropic SDK in turn()",
    "openai SDK, no turn()",
    "conversation",
)
_TURNS: Final = "ABC"


@final
@attrs.frozen
class RetryOrderReport:
    """The results of ``run_retry_order``.

    Attributes:
        runs: Runs per way of calling.
        orders: For each way of calling, how many runs served each order
            (``"A B C"`` is oldest first).
        environment: Interpreter, library versions and machine.
    """

    runs: int
    orders: dict[str, dict[str, int]]
    environment: dict[str, str]

    def oldest_first(self, path: str) -> int:
        """The runs of ``path`` served oldest first."""
        return self.orders[path].get("A B C", 0)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return plain(self)

    def to_json(self) -> str:
        """The report as a JSON document."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """The report as a markdown table."""
        env = self.environment
        lines = [
            "The order three turns are served in when the oldest, A, meets a 429"
            " (Retry-After: 1) while B and C wait; limit 1:"
            f" trio-dispatch {env['trio_dispatch']}, trio {env['trio']},"
            f" openai {env['openai']}, anthropic {env['anthropic']},"
            f" {env['python']} on {env['platform']}, {env['cpus']} CPUs.",
            f"{self.runs} runs per way of calling, on loopback, in real time.",
            "",
            "| Way of calling | A B C | Other orders |",
            "|---|--:|---|",
        ]
        for path, orders in self.orders.items():
            others = ", ".join(
                f"{order} {n}"
                for order, n in sorted(orders.items())
                if order != "A B C"
            )
            lines.append(
                f"| {path} | {self.oldest_first(path)} of {self.runs} | {others or '-'} |"
            )
        return "\n".join(lines) + "\n"


def _prompt(request: FakeRequest) -> str:
    """The text of a request's last message: the turn's name.

    A plain string in both wire formats, as every caller here sends it.
    """
    assert request.body is not None
    return str(request.body["messages"][-1]["content"])


def _script(served: list[str]) -> FakeScript:
    """A's first call: 429 after 0.2 s. Every other call: 200, noted in ``served``."""
    limited: set[str] = set()

    def choose(request: FakeRequest) -> FakeReply | None:
        name = _prompt(request)
        if name == "A" and name not in limited:
            limited.add(name)
            return FakeReply(latency=0.2, fault=Fault("rate_limit", retry_after=1))
        served.append(name)
        return None

    return FakeScript(default=FakeReply(text="ok", latency=0.05), choose=choose)


def _caller(
    path: str, server: FakeLLMServer, dispatcher: Dispatcher, http: httpx2.AsyncClient
) -> Callable[[str], Awaitable[object]]:
    """How ``path`` makes one turn's call, named ``name``."""
    messages: Callable[[str], Any] = lambda name: [{"role": "user", "content": name}]  # noqa: E731
    if path == "anthropic SDK in turn()":
        claude = anthropic.AsyncAnthropic(
            api_key="bench", base_url=server.anthropic_base_url, http_client=http
        )

        async def ask_claude(name: str) -> object:
            with dispatcher.turn(conversation_id=name):
                async with claude.messages.stream(
                    model="fake", max_tokens=16, messages=messages(name)
                ) as stream:
                    return await stream.get_final_text()

        return ask_claude
    if path == "conversation":
        provider = OpenAIProvider(
            id="openai",
            base_url=server.openai_base_url,
            api_key="bench",
            model="fake",
            client=http,
        )

        async def converse(name: str) -> object:
            conversation = dispatcher.start_conversation(provider, conversation_id=name)
            return await conversation.ask(name)

        return converse
    gpt = openai.AsyncOpenAI(
        api_key="bench", base_url=server.openai_base_url, http_client=http
    )

    async def ask_gpt(name: str) -> object:
        stream = await gpt.chat.completions.create(
            model="fake", messages=messages(name), stream=True
        )
        async with stream:
            return [chunk async for chunk in stream]

    if path == "openai SDK, no turn()":
        return ask_gpt

    async def ask_gpt_in_turn(name: str) -> object:
        with dispatcher.turn(conversation_id=name):
            return await ask_gpt(name)

    return ask_gpt_in_turn


async def _run_once(path: str) -> str:
    """One run of ``path``: the order the server answered the turns in."""
    served: list[str] = []
    provider = "anthropic" if path.startswith("anthropic") else "openai"
    async with (
        open_fake_llm_server(_script(served)) as server,
        open_dispatcher({provider: 1}) as dispatcher,
        # A conversation's provider takes its slots itself: a plain client.
        httpx2.AsyncClient(
            transport=None if path == "conversation" else dispatcher.transport(provider)
        ) as http,
    ):
        call = _caller(path, server, dispatcher, http)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "A")
                while not server.requests:  # noqa: ASYNC110 (the server's record, across a socket)
                    await trio.sleep(0.002)
                for name in "BC":
                    nursery.start_soon(call, name)
                    await trio.sleep(0.02)
    if sorted(served) != list(_TURNS):
        raise RuntimeError(f"benchmark went wrong: the server answered {served}")
    return " ".join(served)


def _ignore(_message: str) -> None:
    pass


def run_retry_order(
    *, runs: int = 10, progress: Callable[[str], None] | None = None
) -> RetryOrderReport:
    """Serve the three turns ``runs`` times per way of calling; count the orders.

    Runs its own ``trio.run`` per run (call it outside trio), with the fake
    LLM server on loopback.
    """
    runs = count(runs, "runs")
    say = progress or _ignore
    orders: dict[str, dict[str, int]] = {}
    gc.collect()
    with warnings.catch_warnings():
        # The SDKs leave async generators of httpx2 unclosed: trio warns
        # when they are collected.
        warnings.filterwarnings(
            "ignore",
            message=r"Async generator '(openai|anthropic|httpx2|httpcore2)\.",
            category=ResourceWarning,
        )
        for path in PATHS:
            seen: collections.Counter[str] = collections.Counter()
            for i in range(runs):
                seen[trio.run(_run_once, path)] += 1
                say(f"{path}: run {i + 1} of {runs}, A B C {seen['A B C']}")
            orders[path] = dict(seen)
    found = environment()
    return RetryOrderReport(
        runs=runs,
        orders=orders,
        environment={
            **found,
            "openai": openai.__version__,
            "anthropic": anthropic.__version__,
        },
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = command_line(__doc__)
    parser.add_argument(
        "--runs",
        type=count_option(),
        default=10,
        help="runs per way of calling (default 10)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = run_retry_order(runs=args.runs, progress=show_progress)
    finish(report, json_path=args.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
