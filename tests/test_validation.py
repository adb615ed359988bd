"""Every public argument that takes seconds or an instant, refused alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from trio_dispatch import (
    ConversationOptions,
    Dispatcher,
    SlotPolicy,
    open_dispatcher,
    wrap_provider,
)
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import AnthropicProvider, LimitedProvider, OpenAIProvider
from trio_dispatch.testing import (
    BurstArrivals,
    Duration,
    FakeReply,
    Fault,
    SimProvider,
    TurnSpec,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

    from trio_dispatch.messages import StreamEvent

HUGE = 10**400  # an int, and finite, but beyond any float
SECONDS = "must be a non-negative number of seconds"
POSITIVE_SECONDS = "must be a positive number of seconds"
INSTANT = "must be a finite number"


class _Named:
    """Stands for a provider: only its id is read before the check."""

    id = "p"

    def stream(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        raise AssertionError("never streamed")


def _openai(**options: Any) -> object:  # noqa: ANN401 (any value is the point)
    return OpenAIProvider(
        base_url="https://api.test/v1",
        api_key="k",
        model="m",
        **options,
    )


def _anthropic(**options: Any) -> object:  # noqa: ANN401 (any value is the point)
    return AnthropicProvider(api_key="k", model="m", **options)


# Each call gets an open dispatcher, whether it needs one or not.
CALLS: list[tuple[str, str, Callable[[Dispatcher, Any], object]]] = [
    ("default_pause", SECONDS, lambda d, v: open_dispatcher(default_pause=v)),
    ("max_pause", POSITIVE_SECONDS, lambda d, v: open_dispatcher(max_pause=v)),
    ("max_hold", POSITIVE_SECONDS, lambda d, v: open_dispatcher(max_hold=v)),
    ("max_hold", POSITIVE_SECONDS, lambda d, v: d.slot("p", max_hold=v)),
    ("started_at", INSTANT, lambda d, v: d.slot("p", started_at=v)),
    ("retry_after", SECONDS, lambda d, v: d.report_rate_limit("p", v)),
    (
        "retry_backoff",
        SECONDS,
        lambda d, v: ConversationOptions(retry_backoff=v),
    ),
    (
        "max_backoff",
        SECONDS,
        lambda d, v: ConversationOptions(max_backoff=v),
    ),
    ("started_at", INSTANT, lambda d, v: wrap_provider(_Named(), d, started_at=v)),
    (
        "started_at",
        INSTANT,
        lambda d, v: LimitedProvider(_Named(), d, started_at=v),
    ),
    ("default_pause", SECONDS, lambda d, v: SlotPolicy(1, default_pause=v)),
    ("max_pause", POSITIVE_SECONDS, lambda d, v: SlotPolicy(1, max_pause=v)),
    ("now", INSTANT, lambda d, v: SlotPolicy(1).report_rate_limit(v)),
    ("retry_after", SECONDS, lambda d, v: SlotPolicy(1).report_rate_limit(0.0, v)),
    ("connect_timeout", POSITIVE_SECONDS, lambda d, v: _openai(connect_timeout=v)),
    ("read_timeout", POSITIVE_SECONDS, lambda d, v: _openai(read_timeout=v)),
    ("connect_timeout", POSITIVE_SECONDS, lambda d, v: _anthropic(connect_timeout=v)),
    ("read_timeout", POSITIVE_SECONDS, lambda d, v: _anthropic(read_timeout=v)),
    ("latency", SECONDS, lambda d, v: FakeReply(latency=v)),
    (
        "time_to_first_token",
        SECONDS,
        lambda d, v: FakeReply(time_to_first_token=v),
    ),
    ("retry_after", SECONDS, lambda d, v: Fault("rate_limit", retry_after=v)),
    (
        "retry_after_ms",
        SECONDS,
        lambda d, v: Fault("rate_limit", retry_after_ms=v),
    ),
    (
        "tokens_per_second",
        "must be a positive number",
        lambda d, v: FakeReply(tokens_per_second=v),
    ),
]


@pytest.mark.parametrize(
    ("name", "rule", "call"),
    CALLS,
    ids=[f"{name}-{index}" for index, (name, _, _) in enumerate(CALLS)],
)
@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["huge", "minus-huge"])
async def test_numbers_too_large_for_a_float_get_the_usual_value_error(
    name: str, rule: str, call: Callable[[Dispatcher, Any], object], value: int
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(ValueError, match=rf"^{name} {rule}, got {value}$"):
            call(dispatcher, value)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.granted_total, stats.waiting) == (False, 0, 0)
        assert dispatcher.limits() == {"p": 1}


async def test_an_int_too_long_to_print_is_named_by_its_size() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(
            ValueError,
            match=r"^started_at must be a finite number, got an integer of 16610 bits$",
        ):
            dispatcher.slot("p", started_at=10**5000)
        with pytest.raises(
            ValueError,
            match=r"^retry_after must be a non-negative number of seconds,"
            r" got an integer of 16610 bits$",
        ):
            dispatcher.report_rate_limit("p", 10**5000)


# The simulation's workloads convert their seconds with float() semantics:
# an int beyond any float is refused as the infinity it would round to.
WORKLOADS: list[tuple[str, Callable[[Any], object]]] = [
    ("mean must be a non-negative finite number", Duration.constant),
    (
        "spread must be a non-negative finite number",
        lambda v: Duration("uniform", 1.0, v),
    ),
    ("interval must be a positive finite number", lambda v: BurstArrivals(1, v)),
    (
        "retry_after must be a non-negative finite number",
        lambda v: SimProvider("p", 1, retry_after=v),
    ),
    (
        "reject_latency must be a non-negative finite number",
        lambda v: SimProvider("p", 1, reject_latency=v),
    ),
    (
        "arrival must be a non-negative finite number",
        lambda v: TurnSpec(v, "p", (1.0,)),
    ),
    (
        "durations must be non-negative finite numbers",
        lambda v: TurnSpec(0.0, "p", (v,)),
    ),
    (
        "durations must be non-negative finite numbers",
        lambda v: TurnSpec(0.0, "p", (1.0, 1.0), (v,)),
    ),
]


@pytest.mark.parametrize(("message", "call"), WORKLOADS)
@pytest.mark.parametrize(
    ("value", "shown"), [(HUGE, "inf"), (-HUGE, "-inf")], ids=["huge", "minus-huge"]
)
def test_workload_seconds_too_large_for_a_float_get_the_usual_value_error(
    message: str, call: Callable[[Any], object], value: int, shown: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{message}, got {shown}$"):
        call(value)


@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["huge", "minus-huge"])
def test_a_temperature_too_large_for_a_float_gets_the_usual_value_error(
    value: int,
) -> None:
    with pytest.raises(
        ValueError, match=rf"^temperature must be a non-negative number, got {value}$"
    ):
        ChatRequest([ChatMessage("user", "x")], temperature=value)
