"""Shared test helpers."""

from __future__ import annotations

import gc
import re
import sys
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing

from trio_dispatch import UnknownProviderWarning
from trio_dispatch.lowlevel import Grant, SchedulerActor, plumbing
from trio_dispatch.messages import Finish, TextDelta

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from trio_dispatch import Dispatcher, RateLimitInfo
    from trio_dispatch._integrations._hooks import RateLimitHooks
    from trio_dispatch.lowlevel import Ticket
    from trio_dispatch.messages import ChatRequest, StreamEvent


def unknown_provider(name: str) -> pytest.WarningsRecorder:
    """Expect the one warning that ``name``, a provider no limit names, runs unlimited."""
    return pytest.warns(
        UnknownProviderWarning,
        match=rf"^provider {re.escape(repr(name))} has no limit, so it runs unlimited;",
    )


async def settle() -> None:
    """Let every task run until all are blocked, schedulers included."""
    await trio.testing.wait_all_tasks_blocked()


def task_names() -> list[str]:
    """The names of every task in the run."""
    names: list[str] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return names


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and everything behind it, through causes and contexts."""
    seen: list[BaseException] = []
    stack = [exc]
    while stack:
        current = stack.pop()
        if any(current is known for known in seen):
            continue
        seen.append(current)
        stack.extend(
            e for e in (current.__cause__, current.__context__) if e is not None
        )
    return seen


@attrs.define
class RecordingReply:
    """A scheduler ``Reply`` that keeps what it is sent."""

    grants: list[Grant] = attrs.Factory(list)
    errors: list[Exception] = attrs.Factory(list)
    leases: list[float] = attrs.Factory(list)

    def granted(self, ticket: Ticket, granted_at: float) -> None:
        self.grants.append(Grant(ticket, granted_at))

    def refused(self, error: Exception) -> None:
        self.errors.append(error)

    def lease_until(self, deadline: float) -> None:
        self.leases.append(deadline)


def drop(holder: list[Any]) -> None:
    """Drop what ``holder`` holds (its one reference), and collect garbage."""
    holder.clear()
    gc.collect()


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command line in this process: its exit status, stdout and stderr."""
    from trio_dispatch._cli import main  # noqa: PLC0415  # the command line, when used

    try:
        status = main(list(argv))
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def cli_argv(*argv: str, without: Sequence[str] = (), setup: str = "") -> list[str]:
    """The command in a fresh interpreter, as if ``without`` were not installed.

    ``sys.modules[name] = None`` makes ``import name`` fail as a missing
    package does. SIGINT gets Python's own handler back, in case the tests
    run where SIGINT is ignored (a shell's background job): a child would
    inherit that, and Ctrl+C could not be tested. ``setup`` is code run
    just before the command (``signal`` is imported).
    """
    code = (
        "import signal, sys\n"
        f"for name in {list(without)!r}: sys.modules[name] = None\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"{setup}\n"
        "from trio_dispatch._cli import main\n"
        "sys.exit(main())\n"
    )
    return [sys.executable, "-c", code, *argv]


def local_scheduler(dispatcher: Dispatcher, provider: str) -> SchedulerActor:
    """The running local scheduler actor of ``provider``, to send it messages."""
    actor = plumbing(dispatcher)._scheduler(provider)
    assert isinstance(actor, SchedulerActor)
    return actor


class Hooked:
    """A provider whose answers tell their hooks of ``figures`` as they open.

    As ``OpenAIProvider`` and ``AnthropicProvider`` do with their callbacks:
    the figures arrive with the headers, before the stream is handed to the
    caller, and they count this request. Each answer carries them too
    (``rate_limits``) and answers ``"hi"``.
    """

    id = "p"

    def __init__(self, hooks: RateLimitHooks, figures: RateLimitInfo) -> None:
        self.hooks = hooks
        self.figures = figures

    def stream(self, request: ChatRequest) -> HookedAnswer:
        return HookedAnswer(self.hooks, self.figures)


class HookedAnswer:
    """One answer of ``Hooked``: entered, it reads its figures and tells its hooks."""

    def __init__(self, hooks: RateLimitHooks, figures: RateLimitInfo) -> None:
        self.rate_limit_hooks = hooks
        self.rate_limits: RateLimitInfo | None = None
        self._figures = figures
        self._events: Iterator[StreamEvent] = iter([TextDelta("hi"), Finish("stop")])

    async def __aenter__(self) -> HookedAnswer:
        await trio.lowlevel.checkpoint()
        self.rate_limits = self._figures
        self.rate_limit_hooks.observe(self._figures)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await trio.lowlevel.checkpoint()

    def __aiter__(self) -> HookedAnswer:
        return self

    async def __anext__(self) -> StreamEvent:
        await trio.lowlevel.checkpoint()
        event = next(self._events, None)
        if event is None:
            raise StopAsyncIteration
        return event
