"""The fake server with ``FakeBatching``: it queues like a self-hosted server.

The ASGI app is called straight from the test's own trio run, so every time
is virtual and exact: the figures below are binary fractions, and every
sum of them a float without rounding. Each token's time is when its body
chunk reaches the client.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

import attrs
import httpx2
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from trio_dispatch.testing import (
    FakeBatching,
    FakeLLMServer,
    FakeReply,
    FakeScript,
    Fault,
    open_fake_llm_server,
)

if TYPE_CHECKING:
    from trio_dispatch._server_load._load import ServerFormat
    from trio_dispatch.testing import FakeServerStatistics, WireFormat

# A prompt of 64 tokens by the server's estimate (a token per four
# characters of the messages' JSON), so its prefill takes 64 * PREFILL = 1 s.
MESSAGES = [{"role": "user", "content": "x" * 223}]
PROMPT_TOKENS = 64
PREFILL = 1 / 64
DECODE = 0.125
GROWTH = 0.5
KEY = "sk-batching-test"


def batching(slots: int, **figures: Any) -> FakeBatching:  # noqa: ANN401 (FakeBatching's fields)
    """``slots`` slots at the figures above, or at those given."""
    test_figures = {
        "prefill_per_token": PREFILL,
        "decode_per_token": DECODE,
        "decode_growth": GROWTH,
    }
    return FakeBatching(slots=slots, **(test_figures | figures))


def step(running: int) -> float:
    """The documented rule, written out again: each token's step."""
    return DECODE * (1 + GROWTH * (running - 1))


def words(count: int) -> FakeReply:
    """A reply of ``count`` tokens (a word each), with a pace the batch overrides."""
    return FakeReply(
        text=" ".join(["word"] * count), time_to_first_token=5.0, tokens_per_second=1.0
    )


def test_the_prompt_is_as_long_as_the_figures_say() -> None:
    assert len(json.dumps(MESSAGES)) // 4 == PROMPT_TOKENS
    assert PROMPT_TOKENS * PREFILL == 1.0


@attrs.define(eq=False)
class Call:
    """One streaming request, as its client sees it, in virtual time."""

    status: int | None = None
    started_at: float | None = None
    tokens: list[float] = attrs.Factory(list)
    ended_at: float | None = None
    leave: trio.Event = attrs.Factory(trio.Event)

    @property
    def first_token(self) -> float:
        return self.tokens[0]

    @property
    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.tokens, self.tokens[1:], strict=False)]


def _carries_a_token(data: dict[str, Any]) -> bool:
    """Whether an event of either wire format carries a piece of text."""
    if data.get("type") == "content_block_delta":
        return bool(data["delta"].get("text"))
    return any(choice["delta"].get("content") for choice in data.get("choices", ()))


def _token_in(chunk: bytes) -> bool:
    return any(
        line.startswith("data: ")
        and line != "data: [DONE]"
        and _carries_a_token(json.loads(line.removeprefix("data: ")))
        for line in chunk.decode().splitlines()
    )


async def stream(
    server: FakeLLMServer, call: Call, wire: WireFormat = "openai"
) -> None:
    """Send one request straight into the ASGI app and record what comes back.

    Setting ``call.leave`` disconnects the client, as does the response's end.
    """
    if wire == "openai":
        path, headers = "/v1/chat/completions", [(b"authorization", f"Bearer {KEY}")]
    else:
        path = "/v1/messages"
        headers = [(b"x-api-key", KEY), (b"anthropic-version", "2023-06-01")]
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
    if wire == "anthropic":
        body["max_tokens"] = 100
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(name, value.encode()) for name, value in headers],
        "client": ("127.0.0.1", 1),
    }
    incoming = [{"type": "http.request", "body": json.dumps(body).encode()}]

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop()
        await call.leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        now = trio.current_time()
        if message["type"] == "http.response.start":
            call.status, call.started_at = message["status"], now
            return
        if _token_in(message.get("body", b"")):
            call.tokens.append(now)
        if not message.get("more_body", False):
            call.ended_at = now
            call.leave.set()

    await server(scope, receive, send)


async def start_in_order(
    nursery: trio.Nursery, server: FakeLLMServer, count: int
) -> list[Call]:
    """Start ``count`` requests, each arriving (and queued) after the one before."""
    calls = [Call() for _ in range(count)]
    for call in calls:
        nursery.start_soon(stream, server, call)
        await trio.testing.wait_all_tasks_blocked()
    return calls


# -- pace ----------------------------------------------------------------------


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_alone_the_first_token_comes_after_the_prefill_then_one_a_decode_step(
    wire: WireFormat, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeLLMServer(FakeScript(words(4)), batching=batching(2))
    call = Call()
    await stream(server, call, wire)
    # The reply's own time_to_first_token (5 s) and 1 token/s are not used.
    assert call.status == 200
    assert call.started_at == 0.0
    assert call.tokens == [1.0, 1.125, 1.25, 1.375]
    stats = server.statistics()
    assert (stats.running, stats.waiting, stats.completed) == (0, 0, 1)
    assert stats.running_seconds == 1.375
    assert stats.waiting_seconds == 0.0


@pytest.mark.parametrize("concurrent", [1, 2, 3, 4])
async def test_requests_within_the_slots_all_step_at_the_grown_step(
    concurrent: int, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeLLMServer(FakeScript(words(5)), batching=batching(4))
    calls = [Call() for _ in range(concurrent)]
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(stream, server, call)
    for call in calls:
        assert call.first_token == 1.0
        assert call.steps == [step(concurrent)] * 4
    stats = server.statistics()
    assert (stats.peak_in_flight, stats.peak_waiting) == (concurrent, 0)


async def test_a_request_beyond_the_slots_waits_in_line_until_the_first_slot_frees(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two slots: the first two run, the third and fourth wait in line.
    script = FakeScript(replies=(words(2), words(4), words(1), words(1)))
    server = FakeLLMServer(script, batching=batching(2))
    async with trio.open_nursery() as nursery:
        first, second, third, fourth = await start_in_order(nursery, server, 4)
        stats = server.statistics()
        assert (stats.running, stats.waiting, stats.in_flight) == (2, 2, 4)
    # Every request's headers went out at once; the wait is time to first token.
    assert {call.started_at for call in (first, second, third, fourth)} == {0.0}
    assert first.tokens == [1.0, 1.0 + step(2)]
    assert second.tokens == [1.0 + i * step(2) for i in range(4)]
    # The third takes the first slot freed, the fourth the next: first come,
    # first served.
    assert first.ended_at == 1.1875
    assert third.first_token == first.ended_at + 1.0
    assert second.ended_at == 1.5625
    assert fourth.first_token == second.ended_at + 1.0
    stats = server.statistics()
    assert (stats.running, stats.waiting, stats.peak_waiting) == (0, 0, 2)
    # Two waited until 1.1875, one more until 1.5625.
    assert stats.waiting_seconds == 2 * 1.1875 + (1.5625 - 1.1875)
    # Two slots busy until the last slot frees at 2.5625.
    assert stats.running_seconds == 2 * 2.1875 + (2.5625 - 2.1875)


@pytest.mark.parametrize("slots", [1, 3])
async def test_throughput_grows_with_the_batch_up_to_the_slots_and_no_further(
    slots: int, autojump_clock: trio.testing.MockClock
) -> None:
    tokens = 8

    async def tokens_per_second(concurrent: int) -> float:
        server = FakeLLMServer(FakeScript(words(tokens)), batching=batching(slots))
        start = trio.current_time()
        calls = [Call() for _ in range(concurrent)]
        async with trio.open_nursery() as nursery:
            for call in calls:
                nursery.start_soon(stream, server, call)
        assert server.statistics().completed == concurrent
        return concurrent * tokens / (trio.current_time() - start)

    within = [await tokens_per_second(n) for n in range(1, slots + 1)]
    beyond = [await tokens_per_second(n * slots) for n in (2, 3, 4)]
    assert within == sorted(set(within))  # strictly growing
    assert beyond == [within[-1]] * 3
    # At the slots, each wave is one prefill and seven steps.
    assert within[-1] == slots * tokens / (1.0 + (tokens - 1) * step(slots))


async def test_without_growth_a_batch_is_free_and_with_full_growth_it_gains_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def steps(growth: float) -> set[float]:
        figures = batching(3, decode_growth=growth)
        server = FakeLLMServer(FakeScript(words(3)), batching=figures)
        calls = [Call() for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for call in calls:
                nursery.start_soon(stream, server, call)
        return {s for call in calls for s in call.steps}

    assert await steps(0.0) == {DECODE}
    assert await steps(1.0) == {3 * DECODE}


async def test_a_status_fault_is_answered_at_once_without_a_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(replies=(words(40), FakeReply(fault=Fault("server_error"))))
    server = FakeLLMServer(script, batching=batching(1))
    async with trio.open_nursery() as nursery:
        running, refused = await start_in_order(nursery, server, 2)
        await refused.leave.wait()
        assert (refused.status, refused.ended_at) == (500, 0.0)
        assert (server.statistics().running, server.statistics().waiting) == (1, 0)
        running.leave.set()


# -- leaving -------------------------------------------------------------------


async def test_a_client_leaving_the_line_is_out_of_it_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(replies=(words(9), words(9), words(1)))
    server = FakeLLMServer(script, batching=batching(1))
    async with trio.open_nursery() as nursery:
        running, leaving, staying = await start_in_order(nursery, server, 3)
        await trio.sleep(0.5)
        leaving.leave.set()
        stats = await server.wait_until(lambda stats: stats.waiting == 1)
        assert trio.current_time() == 0.5
        assert (stats.running, stats.client_disconnects) == (1, 1)
    assert leaving.tokens == []
    # The one behind it takes the slot as soon as the running one is done.
    assert running.ended_at == 1.0 + 8 * DECODE
    assert staying.first_token == running.ended_at + 1.0
    stats = server.statistics()
    assert stats.waiting_seconds == 0.5 + running.ended_at
    assert stats.completed == 2


async def test_a_client_leaving_its_slot_frees_it_for_the_next_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(replies=(words(40), words(2)))
    server = FakeLLMServer(script, batching=batching(1))
    async with trio.open_nursery() as nursery:
        leaving, waiting = await start_in_order(nursery, server, 2)
        await trio.sleep(1.5625)  # between two tokens
        leaving.leave.set()
    assert leaving.tokens == [1.0, 1.125, 1.25, 1.375, 1.5]
    assert waiting.tokens == [2.5625, 2.6875]
    stats = server.statistics()
    assert (stats.client_disconnects, stats.completed) == (1, 1)
    assert stats.waiting_seconds == 1.5625


async def test_a_stalled_stream_holds_its_slot_until_its_client_leaves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stalled = FakeReply(text="a b", fault=Fault("stall", after_events=2))
    server = FakeLLMServer(
        FakeScript(replies=(stalled, words(1))), batching=batching(1)
    )
    async with trio.open_nursery() as nursery:
        stuck, waiting = await start_in_order(nursery, server, 2)
        await trio.sleep(100)
        assert waiting.tokens == []
        stuck.leave.set()
    assert waiting.tokens == [101.0]


# -- /metrics ------------------------------------------------------------------

# What each server's /metrics calls its running and waiting gauges, and the
# labels it puts on them (written from each server's source, not from ours).
SERVERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "vllm": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        {"model_name": "served/model", "engine": "0"},
    ),
    "llama.cpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred", {}),
    "sglang": (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        {"model_name": "served/model"},
    ),
    "tgi": ("tgi_batch_current_size", "tgi_queue_size", {}),
}


def asgi(server: FakeLLMServer) -> httpx2.ASGITransport:
    """The fake server, served in this trio run: no sockets, virtual time."""
    return httpx2.ASGITransport(app=server)  # type: ignore[arg-type]  # an ASGI app; its annotations are narrower than httpx2's


def gauges(text: str) -> dict[str, tuple[dict[str, str], float]]:
    """Each gauge of an exposition: its one sample's labels and value."""
    found = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family
        assert family.documentation, family
        (sample,) = family.samples
        assert sample.name == family.name
        found[family.name] = (sample.labels, sample.value)
    return found


@pytest.mark.parametrize("metrics", list(SERVERS))
async def test_metrics_tell_the_running_and_the_waiting_in_each_servers_words(
    metrics: ServerFormat, autojump_clock: trio.testing.MockClock
) -> None:
    figures = batching(2, metrics=metrics, model_name="served/model")
    server = FakeLLMServer(FakeScript(words(40)), api_key=KEY, batching=figures)
    running_name, waiting_name, labels = SERVERS[metrics]
    async with (
        httpx2.AsyncClient(transport=asgi(server), base_url="http://fake") as http,
        trio.open_nursery() as nursery,
    ):

        async def read() -> tuple[float, float]:
            # No key: the real servers' /metrics asks for none either.
            response = await http.get("/metrics")
            assert response.status_code == 200
            assert response.headers["content-type"].startswith(
                "text/plain; version=0.0.4"
            )
            found = gauges(response.text)
            assert set(found) == {running_name, waiting_name}
            assert found[running_name][0] == found[waiting_name][0] == labels
            return found[running_name][1], found[waiting_name][1]

        assert await read() == (0, 0)
        calls = await start_in_order(nursery, server, 5)
        assert await read() == (2, 3)
        calls[3].leave.set()
        await server.wait_until(lambda stats: stats.waiting == 2)
        assert await read() == (2, 2)
        calls[0].leave.set()
        await server.wait_until(lambda stats: stats.running == 2 and stats.waiting == 1)
        assert await read() == (2, 1)
        nursery.cancel_scope.cancel()
    stats = server.statistics()
    # Reading the metrics is no LLM request, and no response is counted.
    assert stats.requests_total == 5
    assert stats.responses_by_status == {200: 5}


async def test_vllm_label_values_are_escaped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    figures = batching(1, model_name='a "quoted" \\ name\nthere')
    server = FakeLLMServer(FakeScript(), batching=figures)
    async with httpx2.AsyncClient(transport=asgi(server)) as http:
        text = (await http.get("http://fake/metrics")).text
    assert gauges(text)["vllm:num_requests_running"] == (
        {"model_name": 'a "quoted" \\ name\nthere', "engine": "0"},
        0.0,
    )


async def test_metrics_answer_get_only(autojump_clock: trio.testing.MockClock) -> None:
    server = FakeLLMServer(FakeScript(), batching=batching(1))
    async with httpx2.AsyncClient(transport=asgi(server)) as http:
        response = await http.post("http://fake/metrics")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
    assert server.statistics().responses_by_status == {}


async def test_without_batching_nothing_changes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = FakeReply(text="a b c", time_to_first_token=0.5, tokens_per_second=4.0)
    server = FakeLLMServer(FakeScript(reply))
    assert server.batching is None
    async with httpx2.AsyncClient(transport=asgi(server)) as http:
        assert (await http.get("http://fake/metrics")).status_code == 404
    calls = [Call(), Call()]
    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(stream, server, call)
    assert [call.tokens for call in calls] == [[0.5, 0.75, 1.0]] * 2
    stats = server.statistics()
    assert (stats.running, stats.waiting, stats.peak_waiting) == (0, 0, 0)
    assert (stats.waiting_seconds, stats.running_seconds) == (0.0, 0.0)


async def test_metrics_over_a_socket() -> None:
    async with (
        open_fake_llm_server(batching=FakeBatching(metrics="llama.cpp")) as server,
        httpx2.AsyncClient() as http,
    ):
        assert server.batching == FakeBatching(metrics="llama.cpp")
        response = await http.get(f"{server.base_url}/metrics")
    assert gauges(response.text) == {
        "llamacpp:requests_processing": ({}, 0.0),
        "llamacpp:requests_deferred": ({}, 0.0),
    }


# -- statistics ----------------------------------------------------------------


async def test_wait_until_sees_the_line_grow_and_shrink(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript(words(2)), batching=batching(1))
    seen: list[FakeServerStatistics] = []

    async def watch() -> None:
        seen.append(await server.wait_until(lambda stats: stats.waiting == 2))
        seen.append(await server.wait_until(lambda stats: stats.waiting == 0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await start_in_order(nursery, server, 3)
    assert [(s.running, s.waiting) for s in seen] == [(1, 2), (1, 0)]
    # Each holds the one slot for 1.125 s; the last took it at 2.25, after
    # two waited 1.125 s and one 1.125 s more.
    assert (seen[1].running_seconds, seen[1].waiting_seconds) == (2.25, 3.375)


def test_statistics_outside_a_run_count_up_to_the_last_change() -> None:
    server = FakeLLMServer(FakeScript(), batching=FakeBatching())
    stats = server.statistics()
    assert (stats.running, stats.waiting, stats.waiting_seconds) == (0, 0, 0.0)


# -- the figures, checked ------------------------------------------------------


def test_the_defaults_are_documented_figures() -> None:
    figures = FakeBatching()
    assert figures == FakeBatching(
        slots=4,
        prefill_per_token=0.0005,
        decode_per_token=0.02,
        decode_growth=0.25,
        metrics="vllm",
        model_name="fake-model",
    )
    assert figures.step(4) == pytest.approx(0.035)
    assert figures.prefill(2000) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("slots", 0, ValueError, "slots must be a positive integer, got 0"),
        ("slots", 2.0, TypeError, "slots must be a positive integer, got 2.0"),
        ("slots", True, TypeError, "slots must be a positive integer, got True"),
        (
            "prefill_per_token",
            -0.1,
            ValueError,
            "prefill_per_token must be a non-negative number of seconds, got -0.1",
        ),
        (
            "prefill_per_token",
            math.nan,
            ValueError,
            "prefill_per_token must be a non-negative number of seconds, got nan",
        ),
        (
            "decode_per_token",
            0,
            ValueError,
            "decode_per_token must be a positive number of seconds, got 0",
        ),
        (
            "decode_per_token",
            math.inf,
            ValueError,
            "decode_per_token must be a positive number of seconds, got inf",
        ),
        (
            "decode_growth",
            1.5,
            ValueError,
            "decode_growth must be a number from 0 to 1, got 1.5",
        ),
        (
            "decode_growth",
            "0.5",
            TypeError,
            "decode_growth must be a number from 0 to 1, got '0.5'",
        ),
        (
            "metrics",
            "ollama",
            ValueError,
            "metrics must be one of vllm, llama.cpp, sglang, tgi, got 'ollama'",
        ),
        (
            "metrics",
            None,
            TypeError,
            "metrics must be one of vllm, llama.cpp, sglang, tgi, got None",
        ),
        ("model_name", "", ValueError, "model_name must be a non-empty string, got ''"),
    ],
)
def test_bad_figures_are_refused(
    field: str, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        FakeBatching(**{field: value})  # type: ignore[arg-type]  # the point of the test


def test_a_server_wants_a_fake_batching() -> None:
    with pytest.raises(
        TypeError, match=r"^batching must be a FakeBatching or None, got 4$"
    ):
        FakeLLMServer(FakeScript(), batching=4)  # type: ignore[arg-type]  # the wrong type, on purpose
