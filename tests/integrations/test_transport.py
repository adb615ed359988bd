"""``Dispatcher.transport`` on in-memory transports, in virtual time.

An ``httpx2.MockTransport`` stands in for the network: its handler runs
where the request would be sent, so it sees whether a slot was held then,
and a scripted body shows when the response is closed. The SDKs over real
sockets are in ``test_transport_sdks.py``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import subprocess
import sys
import warnings
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import SlotHoldTimeout, UnknownProviderWarning, open_dispatcher

from .._events import record
from .._helpers import drop

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher
    from trio_dispatch.events import DispatchEvent

# Older httpx2 releases (2.7 among them) leave their own wrapper of a
# response's stream unclosed when the response is closed before its end;
# trio warns when it is collected. Ours are closed, and not excused here.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'httpx2\.:ResourceWarning"
)

URL = "https://llm.test/v1/chat/completions"


class Body(httpx2.AsyncByteStream):
    """A streamed body: ``chunks`` one ``gap`` apart; notes when it is closed."""

    def __init__(self, chunks: int = 3, gap: float = 1.0) -> None:
        self.chunks = chunks
        self.gap = gap
        self.closed_at: float | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(self.chunks):
            await trio.sleep(self.gap)
            yield b"chunk %d\n" % i

    async def aclose(self) -> None:
        if self.closed_at is None:
            self.closed_at = trio.current_time()


def in_flight(dispatcher: Dispatcher, provider: str = "p") -> int:
    """Slots of ``provider`` held now."""
    return dispatcher.statistics().providers[provider].in_flight


def streaming(
    dispatcher: Dispatcher, bodies: list[Body], sent: list[float], **body: float
) -> httpx2.MockTransport:
    """A mock network answering 200 with a new ``Body`` each time, noting when."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        assert in_flight(dispatcher) >= 1
        sent.append(trio.current_time())
        bodies.append(Body(**body))  # type: ignore[arg-type]  # chunks is an int
        return httpx2.Response(200, stream=bodies[-1])

    return httpx2.MockTransport(handle)


@pytest.mark.parametrize(
    ("method", "path", "held"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/v1/completions", True),
        ("POST", "/v1/responses", True),
        ("POST", "/v1/embeddings", True),
        ("POST", "/v1/messages", True),
        ("POST", "/v1/complete", True),
        ("POST", "/openai/deployments/gpt/chat/completions/", True),
        ("GET", "/v1/models", False),
        ("GET", "/v1/chat/completions", False),
        ("POST", "/v1/messages/count_tokens", False),
        ("POST", "/v1/messages/batches", False),
        ("POST", "/v1/files", False),
        ("POST", "/v1/responses/resp_1/cancel", False),
        ("DELETE", "/v1/responses/resp_1", False),
    ],
)
async def test_model_calls_hold_a_slot_while_they_are_sent_and_nothing_else_does(
    method: str, path: str, held: bool
) -> None:
    seen: list[int | None] = []
    async with open_dispatcher({"p": 1}) as dispatcher:

        def handle(request: httpx2.Request) -> httpx2.Response:
            stats = dispatcher.statistics().providers.get("p")
            seen.append(None if stats is None else stats.in_flight)
            return httpx2.Response(200, json={"ok": True})

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            response = await client.request(method, f"https://llm.test{path}")
        assert response.json() == {"ok": True}
        stats = dispatcher.statistics().providers["p"]
    assert seen == [1 if held else 0]
    assert (stats.granted_total, stats.in_flight) == (int(held), 0)


async def test_a_stream_holds_its_slot_until_its_last_byte(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    ends: list[float] = []
    released: list[int] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        inner = streaming(dispatcher, bodies, sent, chunks=3, gap=1.0)
        client = httpx2.AsyncClient(transport=dispatcher.transport("p", inner=inner))

        async def call() -> None:
            async with client.stream("POST", URL) as response:
                assert [c async for c in response.aiter_raw()] == [
                    b"chunk 0\n",
                    b"chunk 1\n",
                    b"chunk 2\n",
                ]
                # Given back after the last byte, before the response is closed
                # (and granted to the next request at once).
                released.append(dispatcher.statistics().providers["p"].released_total)
            ends.append(trio.current_time())

        async with client, trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(call)
        stats = dispatcher.statistics().providers["p"]
    # One at a time: each request is sent when the one before has ended.
    assert sent == [0.0, 3.0, 6.0]
    assert ends == [3.0, 6.0, 9.0]
    assert released == [1, 2, 3]
    assert [body.closed_at for body in bodies] == [3.0, 6.0, 9.0]
    assert (stats.granted_total, stats.released_total, stats.peak_in_flight) == (
        3,
        3,
        1,
    )


async def test_a_body_iterated_again_goes_on_where_it_stopped(
    autojump_clock: trio.abc.Clock,
) -> None:
    # The openai SDK drains a stream's body after [DONE] by iterating
    # ``response.stream`` once more: the body's one inner iterator goes on,
    # and is closed with the body, not left to the garbage collector.
    bodies: list[Body] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        inner = streaming(dispatcher, bodies, [], chunks=3, gap=1.0)
        async with (
            httpx2.AsyncClient(
                transport=dispatcher.transport("p", inner=inner)
            ) as client,
            client.stream("POST", URL) as response,
        ):
            chunks = response.stream
            assert isinstance(chunks, httpx2.AsyncByteStream)
            first = await anext(aiter(chunks))
            rest = [chunk async for chunk in chunks]
            assert in_flight(dispatcher) == 0
        gc.collect()
    assert (first, rest) == (b"chunk 0\n", [b"chunk 1\n", b"chunk 2\n"])
    assert bodies[0].closed_at == 3.0


async def test_closing_a_stream_early_gives_its_slot_back_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        inner = streaming(dispatcher, bodies, sent, chunks=10, gap=1.0)
        async with httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=inner)
        ) as client:
            async with (
                client.stream("POST", URL) as response,
                contextlib.aclosing(response.aiter_raw()) as chunks,
            ):
                assert await anext(chunks) == b"chunk 0\n"
                assert in_flight(dispatcher) == 1
            assert in_flight(dispatcher) == 0
    assert bodies[0].closed_at == 1.0


async def test_cancelling_a_read_gives_the_slot_back(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        inner = streaming(dispatcher, bodies, sent, chunks=10, gap=1.0)
        async with httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=inner)
        ) as client:
            with trio.move_on_after(2.5):
                async with client.stream("POST", URL) as response:
                    async for _ in response.aiter_raw():
                        pass
            assert in_flight(dispatcher) == 0
    assert bodies[0].closed_at == 2.5


async def test_an_error_before_the_answer_gives_the_slot_back() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:

        def refuse(request: httpx2.Request) -> httpx2.Response:
            raise httpx2.ConnectError("refused", request=request)

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(refuse))
        async with httpx2.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx2.ConnectError, match=r"^refused$"):
                await client.post(URL)
        stats = dispatcher.statistics().providers["p"]
    assert (stats.granted_total, stats.released_total) == (1, 1)


async def test_a_request_cancelled_while_it_waits_is_never_sent(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        inner = streaming(dispatcher, bodies, sent, chunks=2, gap=1.0)
        async with httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=inner)
        ) as client:

            async def call() -> None:
                async with client.stream("POST", URL) as response:
                    await response.aread()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await trio.testing.wait_all_tasks_blocked()
                with trio.CancelScope() as waiting:
                    waiting.cancel()
                    await client.post(URL)
                with trio.move_on_after(1.0):
                    await client.post(URL)
            stats = dispatcher.statistics().providers["p"]
    assert sent == [0.0]
    assert (stats.granted_total, stats.withdrawn_total) == (1, 1)


@pytest.mark.parametrize(
    ("status", "headers", "pause"),
    [
        (429, {"retry-after": "2"}, 2.0),
        (503, {"retry-after-ms": "1500"}, 1.5),
        (529, {}, 0.25),
        (500, {"retry-after": "2"}, None),
    ],
)
async def test_a_rate_limit_answer_pauses_the_provider_and_reaches_the_caller_unchanged(
    autojump_clock: trio.abc.Clock,
    status: int,
    headers: dict[str, str],
    pause: float | None,
) -> None:
    body = {"error": {"type": "rate_limit_error", "message": "slow down"}}
    async with open_dispatcher({"p": 2}, default_pause=0.25) as dispatcher:
        await trio.sleep(10)

        def handle(request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(status, headers=headers, json=body)

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            response = await client.post(URL)
        stats = dispatcher.statistics().providers["p"]
    assert response.status_code == status
    assert response.json() == body
    for name, value in headers.items():
        assert response.headers[name] == value
    assert stats.paused_until == (None if pause is None else 10.0 + pause)
    assert stats.in_flight == 0


async def test_max_hold_cuts_a_request_waiting_for_its_answer(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with open_dispatcher({"p": 1}, max_hold=5.0) as dispatcher:

        async def slow(request: httpx2.Request) -> httpx2.Response:
            await trio.sleep(60)
            return httpx2.Response(200)

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(slow))
        async with httpx2.AsyncClient(transport=transport) as client:
            with pytest.raises(
                SlotHoldTimeout,
                match=r"^a slot of 'p' was held longer than max_hold=5 seconds$",
            ):
                await client.post(URL)
        assert trio.current_time() == 5.0
        assert in_flight(dispatcher) == 0


async def test_max_hold_cuts_a_read_and_closes_the_body(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 1}, max_hold=2.5) as dispatcher:
        inner = streaming(dispatcher, bodies, sent, chunks=10, gap=1.0)
        async with httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=inner)
        ) as client:
            got: list[bytes] = []
            with pytest.raises(SlotHoldTimeout):
                async with client.stream("POST", URL) as response:
                    async for chunk in response.aiter_raw():
                        got.append(chunk)
            assert trio.current_time() == 2.5
            assert got == [b"chunk 0\n", b"chunk 1\n"]
            assert in_flight(dispatcher) == 0
    assert bodies[0].closed_at == 2.5


async def test_max_hold_closes_a_body_nobody_reads_and_a_later_read_fails(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 1}, max_hold=2.5) as dispatcher:
        inner = streaming(dispatcher, bodies, sent, chunks=2, gap=1.0)
        async with httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=inner)
        ) as client:
            async with client.stream("POST", URL) as response:
                chunks = response.aiter_raw()
                assert await anext(chunks) == b"chunk 0\n"
                # The consumer stops reading: the timer closes the body and
                # gives the slot back at the deadline, while it sleeps.
                await trio.sleep(2.0)
                assert (in_flight(dispatcher), bodies[0].closed_at) == (0, 2.5)
                with pytest.raises(SlotHoldTimeout):
                    await anext(chunks)
                # The next request goes at once.
                second = await client.post(URL)
                assert second.status_code == 200
                await chunks.aclose()
            stats = dispatcher.statistics().providers["p"]
    assert sent == [0.0, 3.0]
    assert (stats.granted_total, stats.released_total, stats.peak_in_flight) == (
        2,
        2,
        1,
    )


async def test_without_max_hold_a_body_nobody_reads_keeps_its_slot(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        inner = streaming(dispatcher, bodies, sent, chunks=3, gap=1.0)
        async with (
            httpx2.AsyncClient(
                transport=dispatcher.transport("p", inner=inner)
            ) as client,
            client.stream("POST", URL) as response,
        ):
            await trio.sleep(100)
            assert in_flight(dispatcher) == 1
            assert bodies[0].closed_at is None
            await response.aread()
            assert in_flight(dispatcher) == 0


async def test_a_legacy_httpx_inner_gives_a_legacy_transport(
    autojump_clock: trio.abc.Clock,
) -> None:
    sent: list[float] = []
    async with open_dispatcher({"p": 1}, max_hold=10.0) as dispatcher:

        class LegacyBody(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                for _ in range(2):
                    await trio.sleep(1.0)
                    yield b"x"

        def handle(request: httpx.Request) -> httpx.Response:
            sent.append(trio.current_time())
            assert in_flight(dispatcher) == 1
            return httpx.Response(200, stream=LegacyBody())

        transport = dispatcher.transport("p", inner=httpx.MockTransport(handle))
        assert isinstance(transport, httpx.AsyncBaseTransport)
        # httpx's own base class, not httpx2's: httpx.AsyncClient takes no other.
        assert httpx2.AsyncBaseTransport not in type(transport).__mro__
        async with (
            httpx.AsyncClient(transport=transport) as client,
            trio.open_nursery() as nursery,
        ):
            for _ in range(2):
                nursery.start_soon(client.post, URL)
        stats = dispatcher.statistics().providers["p"]
    assert sent == [0.0, 2.0]
    assert (stats.granted_total, stats.released_total) == (2, 2)


async def test_the_default_inner_is_an_httpx2_http_transport() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        transport = dispatcher.transport("p")
        assert isinstance(transport, httpx2.AsyncBaseTransport)
        assert repr(transport).startswith("<trio_dispatch transport 'p' inner=")
        assert "AsyncHTTPTransport" in repr(transport)
        await transport.aclose()


@pytest.mark.parametrize(
    ("provider", "inner", "error", "message"),
    [
        (
            b"p",
            None,
            TypeError,
            r"^provider must be a non-empty string, got b'p'$",
        ),
        (
            "p",
            object(),
            TypeError,
            r"^inner must be an httpx2.AsyncBaseTransport or an"
            r" httpx.AsyncBaseTransport, got object$",
        ),
        (
            "p",
            httpx2.AsyncClient,
            TypeError,
            r"^inner must be an httpx2.AsyncBaseTransport or an"
            r" httpx.AsyncBaseTransport, got type$",
        ),
        ("", None, ValueError, r"^provider must be a non-empty string, got ''$"),
    ],
)
async def test_bad_arguments_are_refused_at_the_call(
    provider: object,
    inner: object,
    error: type[Exception],
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher({"known": 1}) as dispatcher:
        with pytest.raises(error, match=message):
            dispatcher.transport(provider, inner=inner)  # type: ignore[call-overload]  # wrong on purpose
        assert set(dispatcher.statistics().providers) == {"known"}
    # Refused before the unknown provider was looked at.
    assert not caplog.records


async def test_an_unknown_provider_is_refused_at_the_call_when_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher({"known": 1}, unknown_providers="error") as dispatcher:
        with pytest.raises(
            ValueError,
            match=r"^provider 'typo' has no limit; known providers: 'known'$",
        ):
            dispatcher.transport("typo")
    async with open_dispatcher({"known": 1}) as dispatcher:
        with (
            caplog.at_level(logging.WARNING, logger="trio_dispatch"),
            pytest.warns(UnknownProviderWarning) as record,
        ):
            transport = dispatcher.transport("typo")
        await transport.aclose()
    assert (
        [record.getMessage() for record in caplog.records]
        == [str(warning.message) for warning in record]
        == [
            "provider 'typo' has no limit, so it runs unlimited; limited providers: 'known'"
        ]
    )


def test_a_transport_on_httpx2_imports_no_legacy_httpx() -> None:
    code = (
        "import sys, trio, trio_dispatch\n"
        "async def main():\n"
        "    async with trio_dispatch.open_dispatcher({'p': 1}) as d:\n"
        "        await d.transport('p').aclose()\n"
        "assert 'httpx2' not in sys.modules\n"
        "trio.run(main)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'httpx'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout == "[]\n"


async def test_a_legacy_httpx_client_is_refused_before_any_slot() -> None:
    # httpx.AsyncClient hands the transport an httpx.Request, which the
    # httpx2 transport inside failed on with an empty AssertionError, after
    # the slot was granted.
    sent: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)  # pragma: no cover (refused before)
        return httpx2.Response(200)  # pragma: no cover

    async with open_dispatcher({"openai": 1}) as dispatcher:
        transport = dispatcher.transport("openai", inner=httpx2.MockTransport(handle))
        async with httpx.AsyncClient(transport=transport) as client:  # type: ignore[arg-type]  # the misuse under test
            for path in ("/v1/chat/completions", "/v1/models"):
                with pytest.raises(
                    TypeError,
                    match=r"^dispatcher\.transport\('openai'\) serves an"
                    r" httpx2\.AsyncClient, got httpx\.Request: use"
                    r" httpx2\.AsyncClient, or for an httpx\.AsyncClient make it"
                    r" with inner=httpx\.AsyncHTTPTransport\(\)$",
                ):
                    await client.post(f"https://llm.test{path}")
        stats = dispatcher.statistics().providers["openai"]
    assert sent == []
    assert (stats.granted_total, stats.in_flight) == (0, 0)


async def test_an_httpx2_client_is_refused_by_a_legacy_transport() -> None:
    async with open_dispatcher({"openai": 1}) as dispatcher:
        transport = dispatcher.transport(
            "openai", inner=httpx.MockTransport(lambda _: httpx.Response(200))
        )
        async with httpx2.AsyncClient(transport=transport) as client:  # type: ignore[arg-type]  # the misuse under test
            with pytest.raises(
                TypeError,
                match=r"^dispatcher\.transport\('openai', inner=<an httpx transport>\)"
                r" serves an httpx\.AsyncClient, got httpx2\.Request: give it to"
                r" an httpx\.AsyncClient, or make it without inner= for an"
                r" httpx2\.AsyncClient$",
            ):
                await client.post(URL)
        stats = dispatcher.statistics().providers["openai"]
    assert (stats.granted_total, stats.in_flight) == (0, 0)


async def test_a_response_dropped_unclosed_gives_its_slot_back_with_a_warning(
    autojump_clock: trio.abc.Clock,
) -> None:
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 2}) as dispatcher:
        transport = dispatcher.transport("p", inner=streaming(dispatcher, bodies, sent))
        async with httpx2.AsyncClient(transport=transport) as client:
            kept = await client.send(client.build_request("POST", URL), stream=True)
            dropped = [
                await client.send(client.build_request("POST", URL), stream=True)
            ]
            assert in_flight(dispatcher) == 2
            with pytest.warns(
                ResourceWarning,
                match=r"^a model call to 'p' was never closed: its response was"
                r" dropped unclosed, and its slot is given back now; close"
                r" responses \(async with, or aclose\(\)\)$",
            ):
                drop(dropped)
            # The third call gets the dropped call's slot, at once.
            with trio.fail_after(1):
                third = await client.send(
                    client.build_request("POST", URL), stream=True
                )
            assert sent == [0.0, 0.0, 0.0]
            assert in_flight(dispatcher) == 2
            await third.aclose()
            await kept.aclose()
            # Closed responses, collected, warn of nothing.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                del third, kept
                gc.collect()
            assert [
                str(w.message) for w in caught if "model call" in str(w.message)
            ] == []
            await trio.testing.wait_all_tasks_blocked()
        stats = dispatcher.statistics().providers["p"]
    assert (stats.granted_total, stats.released_total, stats.in_flight) == (3, 3, 0)


async def test_a_dropped_response_held_under_max_hold_is_collected_too(
    autojump_clock: trio.abc.Clock,
) -> None:
    # The max_hold timer must not keep the dropped body alive.
    bodies: list[Body] = []
    sent: list[float] = []
    async with open_dispatcher({"p": 1}, max_hold=3600.0) as dispatcher:
        transport = dispatcher.transport("p", inner=streaming(dispatcher, bodies, sent))
        async with httpx2.AsyncClient(transport=transport) as client:
            dropped = [
                await client.send(client.build_request("POST", URL), stream=True)
            ]
            with pytest.warns(ResourceWarning, match=r"^a model call to 'p' was never"):
                drop(dropped)
            with trio.fail_after(1):
                second = await client.send(
                    client.build_request("POST", URL), stream=True
                )
            await second.aclose()
    assert sent == [0.0, 0.0]


async def test_a_legacy_response_dropped_unclosed_gives_its_slot_back() -> None:
    class LegacyBody(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"x"  # pragma: no cover (never read)

    async with open_dispatcher({"p": 1}) as dispatcher:
        transport = dispatcher.transport(
            "p",
            inner=httpx.MockTransport(
                lambda _: httpx.Response(200, stream=LegacyBody())
            ),
        )
        async with httpx.AsyncClient(transport=transport) as client:
            dropped = [
                await client.send(client.build_request("POST", URL), stream=True)
            ]
            with pytest.warns(ResourceWarning, match=r"^a model call to 'p' was never"):
                drop(dropped)
            with trio.fail_after(10):
                second = await client.send(
                    client.build_request("POST", URL), stream=True
                )
            await second.aclose()
        stats = dispatcher.statistics().providers["p"]
    assert (stats.granted_total, stats.released_total) == (2, 2)


def test_a_response_dropped_after_its_run_ended_is_left_alone() -> None:
    # The run, its dispatcher and its slots are gone: nothing to give back.
    async def main() -> list[httpx2.Response]:
        bodies: list[Body] = []
        sent: list[float] = []
        async with open_dispatcher({"p": 1}) as dispatcher:
            inner = streaming(dispatcher, bodies, sent)
            client = httpx2.AsyncClient(
                transport=dispatcher.transport("p", inner=inner)
            )
            return [await client.send(client.build_request("POST", URL), stream=True)]

    left = trio.run(main)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        drop(left)
    assert [str(w.message) for w in caught if "model call" in str(w.message)] == []


# -- a call answered 429 inside a turn keeps the turn's place --------------------
#
# Limit 1. Turn A (the oldest) sends at 0 and is answered 429, Retry-After: 1,
# at 1: the provider pauses until 2. Turns B and C, younger, wait meanwhile.
# Each request is named by its body's "name"; the mock network notes what it
# receives, and when.


class Network:
    """A mock network of either httpx: A's first request gets 429 after 1 s.

    Every other request is answered 200 after 1 s. ``sent`` notes each
    request's name and (virtual) time as it arrives.
    """

    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []

    async def answer(self, name: str) -> tuple[int, dict[str, str]]:
        first = name not in {sent for sent, _ in self.sent}
        self.sent.append((name, trio.current_time()))
        await trio.sleep(1.0)
        if name == "A" and first:
            return 429, {"retry-after": "1"}
        return 200, {}

    def httpx2(self) -> httpx2.MockTransport:
        async def handle(request: httpx2.Request) -> httpx2.Response:
            status, headers = await self.answer(request.content.decode())
            return httpx2.Response(status, headers=headers)

        return httpx2.MockTransport(handle)

    def legacy(self) -> httpx.MockTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            status, headers = await self.answer(request.content.decode())
            return httpx.Response(status, headers=headers)

        return httpx.MockTransport(handle)


@contextlib.asynccontextmanager
async def open_network(
    *,
    legacy: bool = False,
    **options: Any,  # noqa: ANN401 (open_dispatcher's options)
) -> AsyncIterator[tuple[Network, Dispatcher, httpx2.AsyncClient]]:
    """A dispatcher limiting ``"p"`` to 1, and a client whose calls hold its slots."""
    network = Network()
    async with open_dispatcher({"p": 1}, **options) as dispatcher:
        client: Any
        if legacy:
            client = httpx.AsyncClient(
                transport=dispatcher.transport("p", inner=network.legacy())
            )
        else:
            client = httpx2.AsyncClient(
                transport=dispatcher.transport("p", inner=network.httpx2())
            )
        async with client:
            yield network, dispatcher, client


def stats_of(dispatcher: Dispatcher) -> tuple[int, int]:
    """``(in_flight, waiting)`` of ``"p"``."""
    stats = dispatcher.statistics().providers["p"]
    return stats.in_flight, stats.waiting


async def younger_turns(
    nursery: trio.Nursery, dispatcher: Dispatcher, client: httpx2.AsyncClient
) -> None:
    """Start turns B and C, 0.1 s and 0.2 s after now, each sending one call."""
    for name in "BC":
        await trio.sleep(0.1)

        async def turn(name: str = name) -> None:
            with dispatcher.turn(conversation_id=name):
                response = await client.post(URL, content=name.encode())
            assert response.status_code == 200

        nursery.start_soon(turn)


@pytest.mark.parametrize("legacy", [False, True], ids=["httpx2", "httpx"])
async def test_a_retry_in_the_turn_takes_the_place_kept_for_it(
    autojump_clock: trio.abc.Clock, legacy: bool
) -> None:
    statuses: list[int] = []
    async with open_network(legacy=legacy) as (network, dispatcher, client):

        async def a() -> None:
            with dispatcher.turn(conversation_id="A"):
                statuses.append((await client.post(URL, content=b"A")).status_code)
                # The SDK's sleep, and a little more: the pause ends at 2.
                await trio.sleep(1.5)
                assert stats_of(dispatcher) == (1, 2)  # A's place is held
                statuses.append((await client.post(URL, content=b"A")).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            await younger_turns(nursery, dispatcher, client)
        stats = dispatcher.statistics().providers["p"]
    assert statuses == [429, 200]
    assert network.sent == [("A", 0.0), ("A", 2.5), ("B", 3.5), ("C", 4.5)]
    # The place and the retry are one grant.
    assert (stats.granted_total, stats.released_total) == (4, 4)
    assert (stats.in_flight, stats.waiting) == (0, 0)


async def test_a_retry_outside_any_turn_queues_as_a_new_request(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with open_network() as (network, dispatcher, client):

        async def a() -> None:
            assert (await client.post(URL, content=b"A")).status_code == 429
            await trio.sleep(1.5)
            assert stats_of(dispatcher) == (1, 1)  # B holds; nothing kept
            assert (await client.post(URL, content=b"A")).status_code == 200

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            await younger_turns(nursery, dispatcher, client)
    assert network.sent == [("A", 0.0), ("B", 2.0), ("C", 3.0), ("A", 4.0)]


@pytest.mark.parametrize(
    ("options", "given_back"),
    [({}, 4.0), ({"retry_grace": 0.5}, 2.5), ({"retry_grace": 0}, 2.0)],
    ids=["default", "half-a-second", "none"],
)
async def test_a_kept_place_whose_retry_never_comes_is_given_back_after_retry_grace(
    autojump_clock: trio.abc.Clock, options: dict[str, Any], given_back: float
) -> None:
    async with open_network(**options) as (network, dispatcher, client):

        async def a() -> None:
            with dispatcher.turn(conversation_id="A"):
                assert (await client.post(URL, content=b"A")).status_code == 429
                await trio.sleep(100)  # no retry

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            await younger_turns(nursery, dispatcher, client)
            await trio.sleep(given_back + 0.5 - trio.current_time())
            # B was granted the slot the place gave back, at once.
            assert stats_of(dispatcher) == (1, 1)
            nursery.cancel_scope.cancel()
        stats = dispatcher.statistics().providers["p"]
    assert network.sent == [("A", 0.0), ("B", given_back)]
    # A, its place (if kept) and B were granted and gave their slots back
    # (B cancelled with the test); C, cancelled too, never was.
    kept = 1 if options.get("retry_grace") != 0 else 0
    assert (stats.granted_total, stats.released_total) == (2 + kept, 2 + kept)
    assert stats.withdrawn_total == 1


@pytest.mark.parametrize(
    ("left_at", "b_sent_at"),
    [(1.5, 2.0), (2.5, 2.5)],
    ids=["while-it-waits", "once-granted"],
)
async def test_leaving_the_turn_drops_its_kept_place_at_once(
    autojump_clock: trio.abc.Clock, left_at: float, b_sent_at: float
) -> None:
    async with open_network() as (network, dispatcher, client):

        async def a() -> None:
            with dispatcher.turn(conversation_id="A"):
                assert (await client.post(URL, content=b"A")).status_code == 429
                await trio.sleep(left_at - trio.current_time())
                # Kept: waiting through the pause, then granted at 2.
                assert stats_of(dispatcher) == ((0, 3) if left_at < 2.0 else (1, 2))
            # Dropped as the block ends: withdrawn, or given back (and B is
            # granted the slot there and then).
            assert stats_of(dispatcher) == ((0, 2) if left_at < 2.0 else (1, 1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            await younger_turns(nursery, dispatcher, client)
        stats = dispatcher.statistics().providers["p"]
    assert network.sent == [("A", 0.0), ("B", b_sent_at), ("C", b_sent_at + 1.0)]
    assert (stats.in_flight, stats.waiting) == (0, 0)


async def test_a_retry_cancelled_while_its_kept_place_waits_leaks_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with open_network() as (network, dispatcher, client):

        async def a() -> None:
            with dispatcher.turn(conversation_id="A"):
                assert (await client.post(URL, content=b"A")).status_code == 429
                # The retry at once: it takes the place, waiting for the pause.
                async with trio.open_nursery() as retrying:
                    retrying.start_soon(partial(client.post, URL, content=b"A"))
                    await trio.sleep(0.5)
                    assert stats_of(dispatcher) == (0, 3)  # B, C, A's place
                    retrying.cancel_scope.cancel()
                # Withdrawn with the retry: B and C wait, nobody holds.
                assert stats_of(dispatcher) == (0, 2)
                await trio.sleep(10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            await younger_turns(nursery, dispatcher, client)
        stats = dispatcher.statistics().providers["p"]
    assert network.sent == [("A", 0.0), ("B", 2.0), ("C", 3.0)]
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert (stats.granted_total, stats.released_total) == (3, 3)


async def test_a_turn_cancelled_while_its_kept_place_waits_leaks_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with open_network() as (network, dispatcher, client):

        async def a() -> None:
            with trio.move_on_after(1.5), dispatcher.turn(conversation_id="A"):
                assert (await client.post(URL, content=b"A")).status_code == 429
                await client.post(URL, content=b"A")
            assert stats_of(dispatcher) == (0, 2)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            await younger_turns(nursery, dispatcher, client)
            await trio.sleep(1.25 - trio.current_time())
            assert stats_of(dispatcher) == (0, 3)  # B, C, A's place
        stats = dispatcher.statistics().providers["p"]
    assert network.sent == [("A", 0.0), ("B", 2.0), ("C", 3.0)]
    assert (stats.in_flight, stats.waiting) == (0, 0)


async def test_a_kept_place_ends_with_its_dispatcher(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with open_network() as (network, dispatcher, client):
        with dispatcher.turn(conversation_id="A"):
            assert (await client.post(URL, content=b"A")).status_code == 429
            await trio.testing.wait_all_tasks_blocked()
            assert stats_of(dispatcher) == (0, 1)
    # Closed with the place waiting: nothing raised, nothing hangs.
    assert network.sent == [("A", 0.0)]
    assert trio.current_time() == 1.0


async def test_a_kept_place_given_back_unused_is_no_success_for_the_backoff(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Every call is answered 529 without Retry-After, after 1 s: the pauses
    # back off from default_pause, doubling while no call succeeds. A's
    # place, granted at 2 when the first pause ends and given back unused
    # at 2.5, sent nothing: B's 529 at 3.5 is the streak's second round,
    # paused 2 s, not a new streak's first.
    sent: list[float] = []

    async def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(trio.current_time())
        await trio.sleep(1.0)
        return httpx2.Response(529)

    async with open_dispatcher(
        {"p": 1}, default_pause=1.0, retry_grace=0.5
    ) as dispatcher:
        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:

            async def turn(name: str) -> None:
                with dispatcher.turn(conversation_id=name):
                    assert (await client.post(URL)).status_code == 529
                    await trio.sleep(10)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(turn, "A")
                await trio.sleep(0.1)
                nursery.start_soon(turn, "B")
                await trio.sleep(4.0 - trio.current_time())
                stats = dispatcher.statistics().providers["p"]
                nursery.cancel_scope.cancel()
    assert sent == [0.0, 2.5]
    assert stats.paused_until == 3.5 + 2.0


async def test_a_kept_place_shows_in_the_events_as_a_request_of_its_turn(
    autojump_clock: trio.abc.Clock,
) -> None:
    recorded: list[DispatchEvent] = []
    async with (
        trio.open_nursery() as nursery,
        # Closed first: the recording ends with it.
        open_network(retry_grace=0.5) as (network, dispatcher, client),
    ):
        await nursery.start(record, dispatcher, recorded)

        async def a() -> None:
            with dispatcher.turn(conversation_id="A"):
                assert (await client.post(URL, content=b"A")).status_code == 429
                await trio.sleep(10)  # no retry

        async def b() -> None:
            with dispatcher.turn(conversation_id="B"):
                assert (await client.post(URL, content=b"B")).status_code == 200

        async with trio.open_nursery() as turns:
            turns.start_soon(a)
            await trio.sleep(0.1)
            turns.start_soon(b)
            await trio.sleep(4.0)
            turns.cancel_scope.cancel()
    seen = [
        (type(event).__name__, getattr(event, "conversation_id", None), event.at)
        for event in recorded
    ]
    assert network.sent == [("A", 0.0), ("B", 2.5)]
    assert seen == [
        ("Granted", "A", 0.0),
        ("Queued", "B", 0.1),
        ("Paused", None, 1.0),
        ("Released", "A", 1.0),
        # A's place, queued behind the pause, granted first, given back.
        ("Queued", "A", 1.0),
        ("Resumed", None, 2.0),
        ("Granted", "A", 2.0),
        ("Released", "A", 2.5),
        ("Granted", "B", 2.5),
        ("Released", "B", 3.5),
    ]
