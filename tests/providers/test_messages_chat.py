"""Chat messages, stream events, and the private converter at the edge."""

from __future__ import annotations

from typing import TYPE_CHECKING

import cattrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import _converter
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)

if TYPE_CHECKING:
    from collections.abc import Callable

CALL = ToolCall("call_1", "get_weather", {"city": "Paris"}, '{"city": "Paris"}')


def test_a_conversation() -> None:
    request = ChatRequest(
        [
            ChatMessage("user", "Weather in Paris?"),
            ChatMessage("assistant", "", tool_calls=[CALL]),
            ChatMessage("tool", "18 C", tool_call_id="call_1"),
        ],
        tools=[ToolSpec("get_weather", "Weather for a city", {"type": "object"})],
        max_tokens=100,
        temperature=0,
    )
    assert isinstance(request.messages, tuple)
    assert isinstance(request.tools, tuple)
    assert request.messages[1].tool_calls == (CALL,)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: ChatMessage("robot", "hi"),  # type: ignore[arg-type]
            ValueError,
            r"^role must be one of system, user, assistant, tool, got 'robot'$",
        ),
        (
            lambda: ChatMessage(5, "hi"),  # type: ignore[arg-type]
            TypeError,
            r"^role must be one of system, user, assistant, tool, got 5$",
        ),
        (
            lambda: ChatMessage("user", "hi", tool_calls=[CALL]),
            ValueError,
            r"^only assistant messages carry tool_calls, got role 'user'$",
        ),
        (
            lambda: ChatMessage("tool", "18 C"),
            ValueError,
            r"^a tool message needs the tool_call_id it answers$",
        ),
        (
            lambda: ChatMessage("user", "hi", tool_call_id="x"),
            ValueError,
            r"^only tool messages carry a tool_call_id, got role 'user'$",
        ),
        (
            lambda: ChatMessage("assistant", "", tool_calls=["f"]),
            TypeError,
            r"^tool_calls must hold ToolCall values, got 'f'$",
        ),
        (
            lambda: ChatRequest(["hi"]),
            TypeError,
            r"^messages must hold ChatMessage values, got 'hi'$",
        ),
        (
            lambda: ChatRequest([], tools=[{"name": "f"}]),
            TypeError,
            r"^tools must hold ToolSpec values, got ",
        ),
        (
            lambda: ChatRequest([], max_tokens=0),
            ValueError,
            r"^max_tokens must be a positive integer, got 0$",
        ),
        (
            lambda: ChatRequest([], max_tokens=True),
            TypeError,
            r"^max_tokens must be a positive integer, got True$",
        ),
        (
            lambda: ChatRequest([], temperature=-0.5),
            ValueError,
            r"^temperature must be a non-negative number, got -0\.5$",
        ),
        (
            lambda: ChatRequest([], temperature=float("nan")),
            ValueError,
            r"^temperature must be a non-negative number, got nan$",
        ),
        (
            lambda: ChatMessage("user", None),  # type: ignore[arg-type]
            TypeError,
            r"^content must be a string, got None$",
        ),
        (
            lambda: ChatMessage("user", ["hi"]),  # type: ignore[arg-type]
            TypeError,
            r"^content must be a string, got \['hi'\]$",
        ),
        (
            lambda: ChatMessage("tool", "18 C", tool_call_id=1),  # type: ignore[arg-type]
            TypeError,
            r"^tool_call_id must be a string, got 1$",
        ),
        (
            lambda: ChatMessage("tool", "18 C", tool_call_id=""),
            ValueError,
            r"^a tool message needs the tool_call_id it answers$",
        ),
        (
            lambda: ChatMessage("user", "hi", name=b"ann"),  # type: ignore[arg-type]
            TypeError,
            r"^name must be a non-empty string, got b'ann'$",
        ),
        (
            lambda: ChatMessage("user", "hi", name=""),
            ValueError,
            r"^name must be a non-empty string, got ''$",
        ),
        (
            lambda: ToolSpec("", "Weather", {"type": "object"}),
            ValueError,
            r"^name must be a non-empty string, got ''$",
        ),
        (
            lambda: ToolSpec(None, "Weather", {"type": "object"}),  # type: ignore[arg-type]
            TypeError,
            r"^name must be a non-empty string, got None$",
        ),
        (
            lambda: ToolSpec("f", 3, {"type": "object"}),  # type: ignore[arg-type]
            TypeError,
            r"^description must be a string, got 3$",
        ),
        (
            lambda: ToolSpec("f", "", "object"),
            TypeError,
            r"^parameters must be a JSON schema object, got 'object'$",
        ),
        (
            lambda: ToolSpec("f", "", {"type": {1, 2}}),
            TypeError,
            r"^parameters\['type'\] must be JSON, got set$",
        ),
        (
            lambda: ToolSpec("f", "", {"maximum": float("inf")}),
            ValueError,
            r"^parameters\['maximum'\] must be JSON, got inf$",
        ),
        (
            lambda: ChatRequest([], system=["be brief"]),  # type: ignore[arg-type]
            TypeError,
            r"^system must be a string, got \['be brief'\]$",
        ),
    ],
)
def test_bad_values_are_refused_at_once(
    make: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


def test_a_tool_holds_a_copy_of_its_schema() -> None:
    city: dict[str, str] = {"type": "string"}
    schema = {"type": "object", "properties": {"city": city}}
    spec = ToolSpec("get_weather", "", schema)
    city["type"] = "number"
    assert spec.parameters == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
    }


def test_usage_prompt_tokens_adds_the_parts() -> None:
    usage = Usage(
        input_tokens=4, output_tokens=9, cache_read_tokens=900, cache_write_tokens=96
    )
    assert usage.prompt_tokens == 1000


def test_values_are_frozen() -> None:
    with pytest.raises(AttributeError):
        TextDelta("a").text = "b"  # type: ignore[misc]


# -- the converter ---------------------------------------------------------


EVENTS: list[StreamEvent] = [
    TextDelta("Hel"),
    ReasoningDelta("hmm"),
    CALL,
    ToolCall("call_2", "f", {}, '{"a": ', "arguments are not valid JSON: ..."),
    Finish("tool_calls"),
    Usage(1, 2, 3, 4),
]


def test_stream_events_round_trip_with_a_type_tag() -> None:
    wire = [_converter.unstructure_as(event, StreamEvent) for event in EVENTS]
    assert wire[0] == {"type": "text_delta", "text": "Hel"}
    assert wire[4] == {"type": "finish", "reason": "tool_calls"}
    assert wire[2] == {
        "type": "tool_call",
        "id": "call_1",
        "name": "get_weather",
        "arguments": {"city": "Paris"},
        "raw_arguments": '{"city": "Paris"}',
        "arguments_error": None,
    }
    assert [_converter.structure_as(item, StreamEvent) for item in wire] == EVENTS


def test_a_chat_request_round_trips() -> None:
    request = ChatRequest(
        [
            ChatMessage("user", "hi", name="ana"),
            ChatMessage("assistant", "", tool_calls=[CALL]),
        ],
        tools=[ToolSpec("f", "does f", {"type": "object"})],
        system="be brief",
    )
    data = _converter.unstructure(request)
    assert data["messages"][1]["tool_calls"][0]["name"] == "get_weather"
    assert _converter.structure(data, ChatRequest) == request


def test_the_converter_is_strict_and_says_where() -> None:
    data = {"messages": [{"role": "user", "content": 5}], "max_tokens": "100"}
    with pytest.raises(cattrs.ClassValidationError) as caught:
        _converter.structure(data, ChatRequest)
    assert _converter.describe_error(caught.value) == (
        "expected a string, got number @ $.messages[0].content; "
        "expected an integer, got string @ $.max_tokens"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"input_tokens": True, "output_tokens": 1},
            "expected an integer, got boolean @ $.input_tokens",
        ),
        (
            {"input_tokens": 1.5, "output_tokens": 1},
            "expected an integer, got number @ $.input_tokens",
        ),
        ({"input_tokens": 1}, "required field missing @ $.output_tokens"),
        ("usage", "expected an object, got string @ $"),
    ],
)
def test_no_lenient_coercion(data: object, message: str) -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 (the kind varies; the message is the point)
        _converter.structure(data, Usage)
    assert _converter.describe_error(caught.value) == message


def test_floats_take_integers_but_not_strings() -> None:
    assert (
        _converter.structure(
            {"messages": [], "temperature": 1}, ChatRequest
        ).temperature
        == 1.0
    )
    with pytest.raises(cattrs.ClassValidationError) as caught:
        _converter.structure({"messages": [], "temperature": "1"}, ChatRequest)
    assert (
        _converter.describe_error(caught.value)
        == "expected a number, got string @ $.temperature"
    )


def test_an_unknown_tag_is_refused() -> None:
    with pytest.raises(Exception) as caught:  # noqa: PT011 (cattrs' own error kind)
        _converter.structure_as({"type": "telepathy"}, StreamEvent)
    assert _converter.describe_error(caught.value) == (
        "unknown stream event type 'telepathy' @ $"
    )


@given(
    st.lists(
        st.one_of(
            st.builds(TextDelta, st.text()),
            st.builds(ReasoningDelta, st.text()),
            st.builds(Finish, st.text()),
            st.builds(
                Usage, st.integers(0), st.integers(0), st.integers(0), st.integers(0)
            ),
            st.builds(
                ToolCall,
                st.text(),
                st.text(),
                st.dictionaries(
                    st.text(), st.integers() | st.text() | st.booleans() | st.none()
                ),
                st.text(),
                st.none() | st.text(),
            ),
        )
    )
)
def test_any_events_round_trip(events: list[StreamEvent]) -> None:
    wire = [_converter.unstructure_as(event, StreamEvent) for event in events]
    assert [_converter.structure_as(item, StreamEvent) for item in wire] == events
