"""A provider name that matches no limit is unlimited by accident: say so.

``OpenAIProvider(id="OpenAI")`` under ``open_dispatcher({"openai": 2})``
used to put every request on the wire at once, and ``statistics()`` did not
show it.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import UnknownProviderWarning, open_dispatcher, wrap_provider
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.testing import FakeScript, ScriptedProvider

from .._helpers import settle, task_names, unknown_provider

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trio_dispatch import Dispatcher, Provider


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "trio_dispatch" and record.levelno == logging.WARNING
    ]


def warned(record: pytest.WarningsRecorder) -> list[str]:
    return [str(warning.message) for warning in record]


async def _take(dispatcher: Dispatcher, provider: str) -> None:
    async with dispatcher.slot(provider):
        pass


async def _call_ten_at_once(dispatcher: Dispatcher, provider: str) -> None:
    gate = trio.Event()

    async def call() -> None:
        async with dispatcher.slot(provider):
            await gate.wait()

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(call)
        await settle()
        gate.set()


async def test_an_unknown_provider_warns_once_per_name_and_shows_in_statistics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher({"openai": 2, "anthropic": 1}) as dispatcher:
        with unknown_provider("OpenAI"):
            await _call_ten_at_once(dispatcher, "OpenAI")
        # Once per name: one more warning would fail (filterwarnings = error).
        await _call_ten_at_once(dispatcher, "OpenAI")
        await _call_ten_at_once(dispatcher, "openai")
        with unknown_provider("gpt-x"):
            await _take(dispatcher, "gpt-x")
        assert logged(caplog) == [
            "provider 'OpenAI' has no limit, so it runs unlimited;"
            " limited providers: 'anthropic', 'openai'; did you mean 'openai'?",
            "provider 'gpt-x' has no limit, so it runs unlimited;"
            " limited providers: 'anthropic', 'openai'",
        ]
        stats = dispatcher.statistics().providers
        assert list(stats) == ["openai", "anthropic", "OpenAI", "gpt-x"]
        wrong = stats["OpenAI"]
        assert (wrong.limit, wrong.peak_in_flight, wrong.granted_total) == (
            None,
            10,
            20,
        )
        right = stats["openai"]
        assert (right.limit, right.peak_in_flight, right.granted_total) == (2, 2, 10)


@pytest.mark.parametrize("slip", ["opneai", "OpenAI", "OPENAI", "openia"])
async def test_a_name_close_to_a_limited_one_suggests_it(
    caplog: pytest.LogCaptureFixture, slip: str
) -> None:
    async with open_dispatcher({"openai": 2, "anthropic": 1}) as dispatcher:
        with pytest.warns(UnknownProviderWarning) as first:
            await _take(dispatcher, slip)
        with pytest.warns(UnknownProviderWarning) as second:
            await _take(dispatcher, "claude")
    assert (
        logged(caplog)
        == warned(first) + warned(second)
        == [
            f"provider {slip!r} has no limit, so it runs unlimited;"
            " limited providers: 'anthropic', 'openai'; did you mean 'openai'?",
            "provider 'claude' has no limit, so it runs unlimited;"
            " limited providers: 'anthropic', 'openai'",
        ]
    )
    async with open_dispatcher(
        {"openai": 2, "anthropic": 1}, unknown_providers="error"
    ) as dispatcher:
        with pytest.raises(
            ValueError,
            match=rf"^provider {slip!r} has no limit;"
            r" known providers: 'anthropic', 'openai'; did you mean 'openai'\?$",
        ):
            dispatcher.slot(slip)
        with pytest.raises(
            ValueError, match=r"^provider 'anthropc' has no limit;.*'anthropic'\?$"
        ):
            dispatcher.slot("anthropc")


async def test_a_warning_names_no_limited_provider_when_there_is_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher() as dispatcher:
        with pytest.warns(UnknownProviderWarning) as record:
            await _take(dispatcher, "p")
    assert (
        logged(caplog)
        == warned(record)
        == ["provider 'p' has no limit, so it runs unlimited; limited providers: none"]
    )


async def test_an_unknown_provider_is_refused_at_once_in_error_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher(
        {"openai": 2, "anthropic": 1}, unknown_providers="error"
    ) as dispatcher:
        with pytest.raises(
            ValueError,
            match=r"^provider 'OpenAI' has no limit;"
            r" known providers: 'anthropic', 'openai'; did you mean 'openai'\?$",
        ):
            dispatcher.slot("OpenAI")
        with pytest.raises(
            ValueError,
            match=r"^provider 'OpenAI' has no limit;"
            r" known providers: 'anthropic', 'openai'; did you mean 'openai'\?$",
        ):
            dispatcher.start_conversation(_NamedProvider("OpenAI"))
        await settle()
        # Nothing changed: no scheduler, no statistics, no conversation.
        assert list(dispatcher.statistics().providers) == ["openai", "anthropic"]
        assert sum(name.startswith("trio_dispatch") for name in task_names()) == 2
        # Named on purpose, it is known: limited, or unlimited by choice.
        dispatcher.set_limit("OpenAI", 1)
        dispatcher.remove_limit("local")
        async with dispatcher.slot("OpenAI") as limited, dispatcher.slot("local"):
            assert limited.held
        with pytest.raises(
            ValueError,
            match=r"^provider 'other' has no limit;"
            r" known providers: 'OpenAI', 'anthropic', 'local', 'openai'$",
        ):
            dispatcher.slot("other")
        stats = dispatcher.statistics().providers
        assert (stats["OpenAI"].limit, stats["local"].limit) == (1, None)
        assert "other" not in stats
    assert logged(caplog) == []


async def test_allow_mode_and_remove_limit_run_unlimited_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher({"openai": 2}, unknown_providers="allow") as dispatcher:
        await _call_ten_at_once(dispatcher, "OpenAI")
        assert dispatcher.statistics().providers["OpenAI"].peak_in_flight == 10
    async with open_dispatcher({"openai": 2}) as dispatcher:
        dispatcher.remove_limit("local")
        dispatcher.remove_limit("openai")
        await _call_ten_at_once(dispatcher, "local")
        await _call_ten_at_once(dispatcher, "openai")
        stats = dispatcher.statistics().providers
        assert (stats["local"].limit, stats["local"].peak_in_flight) == (None, 10)
        assert (stats["openai"].limit, stats["openai"].peak_in_flight) == (None, 10)
    assert logged(caplog) == []


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("ignore", ValueError),
        ("WARN", ValueError),
        ("", ValueError),
        (None, TypeError),
        (True, TypeError),
        (["warn"], TypeError),
    ],
)
def test_a_bad_unknown_providers_is_refused_at_the_call(
    value: object, error: type[Exception]
) -> None:
    with pytest.raises(
        error,
        match=rf"^unknown_providers must be 'allow', 'warn' or 'error',"
        rf" got {re.escape(repr(value))}$",
    ):
        open_dispatcher({"p": 1}, unknown_providers=value)  # type: ignore[arg-type]  # the point


class _NamedProvider:
    """Just enough of a ``Provider`` for ``start_conversation`` to check it."""

    def __init__(self, name: str) -> None:
        self.id = name

    def stream(self, request: Any) -> Any:  # noqa: ANN401 (never called)
        raise NotImplementedError


# ------------------------------------------------------------------ warning

_OPNEAI = (
    r"^provider 'opneai' has no limit, so it runs unlimited;"
    r" limited providers: 'anthropic', 'openai'; did you mean 'openai'\?$"
)


async def _stream_once(provider: Provider) -> None:
    request = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))
    async with provider.stream(request) as events:
        async for _event in events:
            pass


def _through_slot(dispatcher: Dispatcher) -> Awaitable[object]:
    return _take(dispatcher, "opneai")


def _through_transport(dispatcher: Dispatcher) -> Awaitable[object]:
    transport = dispatcher.transport(
        "opneai", inner=httpx2.MockTransport(lambda _request: httpx2.Response(200))
    )
    return transport.aclose()


def _through_conversation(dispatcher: Dispatcher) -> Awaitable[object]:
    conversation = dispatcher.start_conversation(
        ScriptedProvider(FakeScript(), id="opneai")
    )
    return conversation.ask("hi")


def _through_wrap_provider(dispatcher: Dispatcher) -> Awaitable[object]:
    return _stream_once(
        wrap_provider(ScriptedProvider(FakeScript(), id="opneai"), dispatcher)
    )


@pytest.mark.parametrize(
    "entry",
    [_through_slot, _through_transport, _through_conversation, _through_wrap_provider],
)
async def test_an_unknown_provider_issues_a_warning_once_per_name_wherever_it_arrives(
    entry: Callable[[Dispatcher], Awaitable[object]],
) -> None:
    for _ in range(2):  # each dispatcher warns once
        async with open_dispatcher({"openai": 2, "anthropic": 1}) as dispatcher:
            with pytest.warns(UnknownProviderWarning, match=_OPNEAI) as record:
                await entry(dispatcher)
            assert len(record) == 1
            # It points at the application's line, not at the package's.
            assert record[0].filename == __file__
            # Once per name: every later use of it is quiet.
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                await _through_slot(dispatcher)
                await _call_ten_at_once(dispatcher, "opneai")
            stats = dispatcher.statistics().providers["opneai"]
            assert stats.limit is None


async def test_an_unknown_provider_warning_turned_into_an_error_refuses_every_use() -> (
    None
):
    async with open_dispatcher({"openai": 2, "anthropic": 1}) as dispatcher:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnknownProviderWarning)
            for _ in range(2):
                with pytest.raises(UnknownProviderWarning, match=_OPNEAI):
                    dispatcher.slot("opneai")
        await settle()
        # Refused before anything started: no scheduler, no statistics.
        assert list(dispatcher.statistics().providers) == ["openai", "anthropic"]
        assert sum(name.startswith("trio_dispatch") for name in task_names()) == 2


async def test_allow_mode_issues_no_warning() -> None:
    async with open_dispatcher({"openai": 2}, unknown_providers="allow") as dispatcher:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await _call_ten_at_once(dispatcher, "opneai")
