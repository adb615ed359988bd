"""Every public argument that takes a count, seconds or a number, refused alike.

The rule (``trio_dispatch._validation``): a value of the wrong type raises
``TypeError``, a value of the right type out of range raises ``ValueError``,
both as ``"{name} must be {rule}, got {value!r}"``, and nothing changes.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import pytest

from trio_dispatch import (
    ConversationOptions,
    Dispatcher,
    open_dispatcher,
    wrap_provider,
)
from trio_dispatch._validation import check_limit, positive_int, redact_url, validator
from trio_dispatch.lowlevel import SlotPolicy
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider
from trio_dispatch.testing import (
    BurstArrivals,
    CallsPerTurn,
    Duration,
    FakeReply,
    Fault,
    PoissonArrivals,
    Scenario,
    SimProvider,
    TurnSpec,
    Workload,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

    from trio_dispatch.messages import StreamEvent

    Call: TypeAlias = Callable[[Dispatcher, Any], object]

HUGE = 10**400  # an int, and finite, but beyond any float


@attrs.frozen
class Kind:
    """What an argument takes: the rule's words, wrong types, values out of range."""

    rule: str
    wrong: tuple[object, ...]
    bad: tuple[object, ...]


_NOT_INTEGERS = ("1", 1.0, True)
_NOT_NUMBERS = ("1", True, None)
_OUT_OF_RANGE = (-1, -0.5, math.nan, math.inf, -math.inf, HUGE, -HUGE)

POSITIVE_INTEGER = Kind("a positive integer", _NOT_INTEGERS, (0, -1))
NON_NEGATIVE_INTEGER = Kind("a non-negative integer", _NOT_INTEGERS, (-1,))
SECONDS = Kind("a non-negative number of seconds", _NOT_NUMBERS, _OUT_OF_RANGE)
POSITIVE_SECONDS = Kind(
    "a positive number of seconds", _NOT_NUMBERS, (0, 0.0, *_OUT_OF_RANGE)
)
NUMBER = Kind("a non-negative number", _NOT_NUMBERS, _OUT_OF_RANGE)
POSITIVE_NUMBER = Kind("a positive number", _NOT_NUMBERS, (0, 0.0, *_OUT_OF_RANGE))
INSTANT = Kind("a finite number", _NOT_NUMBERS, (math.nan, math.inf, -math.inf, HUGE))
DEADLINE = Kind("a number", _NOT_NUMBERS, (math.nan,))  # infinities: never
SEED = Kind("an integer or None", ("1", 1.0, True), ())  # any int will do


def optional(kind: Kind) -> Kind:
    """``kind``, for an argument that also takes ``None``."""
    return attrs.evolve(kind, wrong=tuple(w for w in kind.wrong if w is not None))


class _Named:
    """Stands for a provider: only its id is read before the check."""

    id = "p"

    def stream(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        raise AssertionError("never streamed")


def _openai(**options: Any) -> object:  # noqa: ANN401 (any value is the point)
    return OpenAIProvider(
        base_url="https://api.test/v1", api_key="k", model="m", **options
    )


def _anthropic(**options: Any) -> object:  # noqa: ANN401 (any value is the point)
    return AnthropicProvider(api_key="k", model="m", **options)


SIM = (SimProvider("p", 1),)

# (argument, what it takes, a call that passes the value; each call gets an
# open dispatcher limiting "p" to 1, whether it needs one or not).
ENTRY_POINTS: list[tuple[str, Kind, Call]] = [
    # The dispatcher.
    ("limit for 'p'", POSITIVE_INTEGER, lambda d, v: open_dispatcher({"p": v})),
    ("max_waiting", NON_NEGATIVE_INTEGER, lambda d, v: open_dispatcher(max_waiting=v)),
    ("default_pause", SECONDS, lambda d, v: open_dispatcher(default_pause=v)),
    ("max_pause", POSITIVE_SECONDS, lambda d, v: open_dispatcher(max_pause=v)),
    ("max_hold", optional(POSITIVE_SECONDS), lambda d, v: open_dispatcher(max_hold=v)),
    ("retry_grace", SECONDS, lambda d, v: open_dispatcher(retry_grace=v)),
    ("max_hold", optional(POSITIVE_SECONDS), lambda d, v: d.slot("p", max_hold=v)),
    ("started_at", optional(INSTANT), lambda d, v: d.slot("p", started_at=v)),
    ("limit", POSITIVE_INTEGER, lambda d, v: d.set_limit("p", v)),
    ("retry_after", optional(SECONDS), lambda d, v: d.report_rate_limit("p", v)),
    (
        "started_at",
        optional(INSTANT),
        lambda d, v: wrap_provider(_Named(), d, started_at=v),
    ),
    # The policy core.
    ("limit", POSITIVE_INTEGER, lambda d, v: SlotPolicy(v)),
    ("max_waiting", NON_NEGATIVE_INTEGER, lambda d, v: SlotPolicy(1, max_waiting=v)),
    ("default_pause", SECONDS, lambda d, v: SlotPolicy(1, default_pause=v)),
    ("max_pause", POSITIVE_SECONDS, lambda d, v: SlotPolicy(1, max_pause=v)),
    ("limit", POSITIVE_INTEGER, lambda d, v: SlotPolicy(1).set_limit(v)),
    ("now", INSTANT, lambda d, v: SlotPolicy(1).report_rate_limit(v)),
    (
        "retry_after",
        optional(SECONDS),
        lambda d, v: SlotPolicy(1).report_rate_limit(0.0, v),
    ),
    ("until", DEADLINE, lambda d, v: SlotPolicy(1).pause(v)),
    # Conversations.
    ("max_attempts", POSITIVE_INTEGER, lambda d, v: ConversationOptions(max_attempts=v)),
    ("retry_backoff", SECONDS, lambda d, v: ConversationOptions(retry_backoff=v)),
    ("max_backoff", SECONDS, lambda d, v: ConversationOptions(max_backoff=v)),
    (
        "context_budget",
        POSITIVE_INTEGER,
        lambda d, v: ConversationOptions(context_budget=v),
    ),
    ("keep_recent", NON_NEGATIVE_INTEGER, lambda d, v: ConversationOptions(keep_recent=v)),
    ("max_tokens", POSITIVE_INTEGER, lambda d, v: ConversationOptions(max_tokens=v)),
    ("seed", SEED, lambda d, v: ConversationOptions(seed=v)),
    # Providers and requests.
    ("connect_timeout", POSITIVE_SECONDS, lambda d, v: _openai(connect_timeout=v)),
    ("read_timeout", POSITIVE_SECONDS, lambda d, v: _openai(read_timeout=v)),
    ("connect_timeout", POSITIVE_SECONDS, lambda d, v: _anthropic(connect_timeout=v)),
    ("read_timeout", POSITIVE_SECONDS, lambda d, v: _anthropic(read_timeout=v)),
    ("max_tokens", POSITIVE_INTEGER, lambda d, v: _anthropic(max_tokens=v)),
    (
        "max_tokens",
        POSITIVE_INTEGER,
        lambda d, v: ChatRequest([ChatMessage("user", "x")], max_tokens=v),
    ),
    (
        "temperature",
        optional(NUMBER),
        lambda d, v: ChatRequest([ChatMessage("user", "x")], temperature=v),
    ),
    # The fake server's script.
    ("latency", SECONDS, lambda d, v: FakeReply(latency=v)),
    ("time_to_first_token", SECONDS, lambda d, v: FakeReply(time_to_first_token=v)),
    (
        "tokens_per_second",
        optional(POSITIVE_NUMBER),
        lambda d, v: FakeReply(tokens_per_second=v),
    ),
    ("argument_chunks", POSITIVE_INTEGER, lambda d, v: FakeReply(argument_chunks=v)),
    ("input_tokens", NON_NEGATIVE_INTEGER, lambda d, v: FakeReply(input_tokens=v)),
    ("output_tokens", NON_NEGATIVE_INTEGER, lambda d, v: FakeReply(output_tokens=v)),
    ("cache_read_tokens", NON_NEGATIVE_INTEGER, lambda d, v: FakeReply(cache_read_tokens=v)),
    ("cache_write_tokens", NON_NEGATIVE_INTEGER, lambda d, v: FakeReply(cache_write_tokens=v)),
    (
        "after_events",
        NON_NEGATIVE_INTEGER,
        lambda d, v: Fault("disconnect", after_events=v),
    ),
    ("retry_after", optional(SECONDS), lambda d, v: Fault("rate_limit", retry_after=v)),
    (
        "retry_after_ms",
        optional(NUMBER),
        lambda d, v: Fault("rate_limit", retry_after_ms=v),
    ),
    # The simulation's workloads.
    ("mean", SECONDS, lambda d, v: Duration.constant(v)),
    ("spread", NUMBER, lambda d, v: Duration("uniform", 1.0, v)),
    ("low", POSITIVE_INTEGER, lambda d, v: CallsPerTurn(v, 5)),
    ("high", POSITIVE_INTEGER, lambda d, v: CallsPerTurn(1, v)),
    ("load", POSITIVE_NUMBER, lambda d, v: PoissonArrivals(v)),
    ("size", POSITIVE_INTEGER, lambda d, v: BurstArrivals(v, 1.0)),
    ("interval", POSITIVE_SECONDS, lambda d, v: BurstArrivals(1, v)),
    ("limit", POSITIVE_INTEGER, lambda d, v: SimProvider("p", v)),
    ("capacity", POSITIVE_INTEGER, lambda d, v: SimProvider("p", 1, capacity=v)),
    ("retry_after", SECONDS, lambda d, v: SimProvider("p", 1, retry_after=v)),
    ("reject_latency", SECONDS, lambda d, v: SimProvider("p", 1, reject_latency=v)),
    ("weight", POSITIVE_NUMBER, lambda d, v: SimProvider("p", 1, weight=v)),
    ("arrival", SECONDS, lambda d, v: TurnSpec(v, "p", (1.0,))),
    ("calls", SECONDS, lambda d, v: TurnSpec(0.0, "p", (1.0, v))),
    ("tools", SECONDS, lambda d, v: TurnSpec(0.0, "p", (1.0, 1.0), (v,))),
    ("max_attempts", POSITIVE_INTEGER, lambda d, v: Scenario(SIM, (), v)),
    ("agents", POSITIVE_INTEGER, lambda d, v: Workload(v, PoissonArrivals(0.5), SIM)),
    (
        "max_attempts",
        POSITIVE_INTEGER,
        lambda d, v: Workload(1, PoissonArrivals(0.5), SIM, max_attempts=v),
    ),
]  # fmt: skip


def _cases(errors: str) -> list[Any]:
    cases = []
    for index, (name, kind, call) in enumerate(ENTRY_POINTS):
        for value in kind.wrong if errors == "wrong" else kind.bad:
            shown = f"{value!r}"[:12]
            cases.append(
                pytest.param(name, kind.rule, call, value, id=f"{index}-{name}-{shown}")
            )
    return cases


async def _refused(
    error: type[Exception], name: str, rule: str, call: Call, value: object
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        message = re.escape(f"{name} must be {rule}, got {value!r}")
        with pytest.raises(error, match=rf"^{message}$"):
            call(dispatcher, value)
        # Refused at once: the dispatcher is as it was.
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.paused, stats.granted_total, stats.waiting) == (
            1,
            False,
            0,
            0,
        )
        assert dispatcher.limits() == {"p": 1}


@pytest.mark.parametrize(("name", "rule", "call", "value"), _cases("wrong"))
async def test_a_value_of_the_wrong_type_is_a_type_error(
    name: str, rule: str, call: Call, value: object
) -> None:
    await _refused(TypeError, name, rule, call, value)


@pytest.mark.parametrize(("name", "rule", "call", "value"), _cases("bad"))
async def test_a_value_out_of_range_is_a_value_error(
    name: str, rule: str, call: Call, value: object
) -> None:
    await _refused(ValueError, name, rule, call, value)


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


def test_an_int_too_long_to_print_is_named_by_its_size_in_values_too() -> None:
    long = -(10**5000)
    with pytest.raises(
        ValueError,
        match=r"^max_tokens must be a positive integer, got an integer of 16610 bits$",
    ):
        ChatRequest([ChatMessage("user", "x")], max_tokens=long)
    with pytest.raises(
        ValueError,
        match=r"^keep_recent must be a non-negative integer,"
        r" got an integer of 16610 bits$",
    ):
        ConversationOptions(keep_recent=long)
    with pytest.raises(
        TypeError,
        match=r"^name must be a non-empty string, got an integer of 16610 bits$",
    ):
        SimProvider(long, 1)  # type: ignore[arg-type]  # wrong on purpose


def test_a_choice_of_a_few_names_follows_the_rule() -> None:
    rule = (
        "kind must be one of constant, exponential, lognormal, uniform,"
        " empirical, mixture"
    )
    with pytest.raises(ValueError, match=rf"^{rule}, got 'normal'$"):
        Duration("normal", 1.0)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(TypeError, match=rf"^{rule}, got 1$"):
        Duration(1, 1.0)  # type: ignore[arg-type]  # wrong on purpose


def test_an_attrs_validator_is_the_check_named_after_the_field() -> None:
    @attrs.frozen
    class Sizes:
        chunks: int = attrs.field(validator=validator(check_limit))
        pieces: int = attrs.field(default=1, validator=positive_int)

    assert Sizes(2) == Sizes(2, 1)
    with pytest.raises(
        TypeError, match=r"^chunks must be a positive integer, got 2\.0$"
    ):
        Sizes(2.0)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(ValueError, match=r"^pieces must be a positive integer, got 0$"):
        Sizes(1, 0)


def test_every_entry_point_is_tried_with_both_errors() -> None:
    # A kind with nothing to try would make its entry point's checks vacuous.
    for name, kind, _ in ENTRY_POINTS:
        assert kind.wrong, name
        assert kind.bad or kind is SEED, name


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"agents": "3"}, TypeError, "agents must be a positive integer, got '3'"),
        ({"max_calls": 0}, ValueError, "max_calls must be a positive integer, got 0"),
        ({"limit_openai": 2.0}, TypeError, "limit_openai must be a positive integer, got 2.0"),
        ({"load": "1"}, TypeError, "load must be a positive number, got '1'"),
        ({"load": math.nan}, ValueError, "load must be a positive number, got nan"),
        ({"load": 11}, ValueError, "load must be a positive number at most 10, got 11"),
        ({"rate_limit_rate": True}, TypeError, "rate_limit_rate must be a number from 0 to 1, got True"),
        ({"rate_limit_rate": 1.5}, ValueError, "rate_limit_rate must be a number from 0 to 1, got 1.5"),
    ],
)  # fmt: skip
def test_the_demo_options_follow_the_same_rule(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    from trio_dispatch._cli._demo import DemoOptions  # noqa: PLC0415 (needs the demo's extras)

    with pytest.raises(error, match=rf"^{re.escape(message)}$"):
        DemoOptions(**options)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://user:secret@host:6379/0", "redis://***@host:6379/0"),
        ("redis://:secret@host", "redis://***@host"),
        ("redis://token@host", "redis://***@host"),
        ("redis://host:6379/0?password=secret", "redis://host:6379/0?password=***"),
        (
            "rediss://u:p@host/0?db=1&Password=s&username=u&api%5Fkey=k&ssl_cert_reqs=none",
            "rediss://***@host/0?db=1&Password=***&username=***&api%5Fkey=***"
            "&ssl_cert_reqs=none",
        ),
        ("redis://host/0?access_token=t#frag", "redis://host/0?access_token=***#frag"),
        (
            "unix:///tmp/redis.sock?password=p&db=0",
            "unix:///tmp/redis.sock?password=***&db=0",
        ),
        ("redis://host/0?db=1&ssl=true", "redis://host/0?db=1&ssl=true"),
        # An '@' outside the userinfo, or a URL that does not parse: hidden.
        ("redis://u:pa?ss@host/0", "<a URL with credentials>"),
        ("redis://[::1/0?password=x", "<a URL with credentials>"),
        ("redis://[::1/0", "redis://[::1/0"),
    ],
)
def test_redact_url_masks_every_credential(url: str, shown: str) -> None:
    assert redact_url(url) == shown
