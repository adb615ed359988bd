"""The one decoder per wire format: fast on the common deltas, precise on the rest.

Each format's decoder reads every event by hand (``trio_dispatch._wire``);
a field of the wrong kind is named in the words the cattrs converter used
when the decoders had a second, cattrs path. These tests hold it there:

* the common deltas never reach the shape walker that names wrong fields
  (what would quietly regress if a check in the decoder went wrong);
* the decoder's events and errors, step by step through to the end of the
  stream, equal those recorded in ``fixtures/decoder_outcomes.json`` from
  the cattrs decoders: every field of the shapes the hot paths take,
  deleted or replaced by each kind of wrong value in turn, and streams of
  valid and slightly malformed events drawn by the hypothesis strategies
  below, recorded with their outcomes;
* on fresh hypothesis streams, the decoder yields stream events or raises
  a ``ProviderError``, never anything else, and an event that fits its
  shape is never refused as misfitting it;
* what no stream may hold is refused as malformed: event data nested past
  the parser's recursion, an Anthropic content block stopped twice or sent
  a delta after its stop.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch._wire import _anthropic, _decoder
from trio_dispatch._wire._anthropic import AnthropicDecoder
from trio_dispatch._wire._openai import OpenAIDecoder
from trio_dispatch._wire._sse import ServerSentEvent
from trio_dispatch.messages import Finish, ReasoningDelta, TextDelta, ToolCall, Usage
from trio_dispatch.providers import MalformedStream, ProviderError

if TYPE_CHECKING:
    from trio_dispatch._wire._decoder import WireDecoder
    from trio_dispatch.messages import StreamEvent


def event(data: object, name: str | None = None) -> ServerSentEvent:
    text = data if isinstance(data, str) else json.dumps(data)
    return ServerSentEvent(event=name or "message", data=text)


@pytest.fixture
def no_shape_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any walk of an event against its shape fail the test."""

    def refuse(*args: object) -> object:
        raise AssertionError("an event was walked against its shape")

    monkeypatch.setattr(_decoder, "problems", refuse)
    monkeypatch.setattr(_anthropic, "problems", refuse)


# -- the common deltas take the fast path -----------------------------------


def openai_chunk(delta: dict[str, Any]) -> dict[str, Any]:
    """A chunk as OpenAI sends it, envelope and nulls included."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4.1",
        "system_fingerprint": "fp_1",
        "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        ],
        "usage": None,
    }


@pytest.mark.usefixtures("no_shape_walks")
def test_openai_text_reasoning_and_tool_deltas_are_never_walked() -> None:
    decoder = OpenAIDecoder("openai")
    start = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    piece = {"index": 0, "function": {"arguments": '{"a": 1}'}}
    fed = [
        decoder.feed(event(openai_chunk(delta)))
        for delta in (
            {"role": "assistant", "content": "", "refusal": None},
            {"content": "Hel"},
            {"content": None, "reasoning_content": "hmm"},
            {"reasoning": "so"},
            {"tool_calls": [start]},
            {"tool_calls": [piece]},
        )
    ]
    assert fed == [
        [],
        [TextDelta("Hel")],
        [ReasoningDelta("hmm")],
        [ReasoningDelta("so")],
        [],
        [],
    ]


def test_openai_tool_deltas_from_the_fast_path_make_the_call() -> None:
    decoder = OpenAIDecoder("openai")
    start = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}
    pieces = [
        {"index": 0, "function": {"arguments": part}} for part in ('{"a"', ": 1}")
    ]
    events: list[StreamEvent] = []
    for delta in ({"tool_calls": [start]}, *({"tool_calls": [p]} for p in pieces)):
        events += decoder.feed(event(openai_chunk(delta)))
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    for data in (finish, usage, "[DONE]"):
        events += decoder.feed(event(data))
    assert events == [
        ToolCall("call_1", "f", {"a": 1}, '{"a": 1}'),
        Finish("tool_calls"),
        Usage(input_tokens=3, output_tokens=2),
    ]
    assert decoder.done


def anthropic_delta(index: int, delta: dict[str, Any]) -> ServerSentEvent:
    return event(
        {"type": "content_block_delta", "index": index, "delta": delta},
        "content_block_delta",
    )


@pytest.mark.usefixtures("no_shape_walks")
def test_anthropic_text_thinking_and_tool_deltas_are_never_walked() -> None:
    decoder = AnthropicDecoder("anthropic")
    # Block starts are walked against their shape; install the blocks directly.
    for index, kind in enumerate(("text", "thinking", "tool_use")):
        decoder._blocks[index] = _anthropic._Block(kind, id="toolu_1", name="f")
    fed = [
        decoder.feed(anthropic_delta(index, delta))
        for index, delta in (
            (0, {"type": "text_delta", "text": "Hel"}),
            (1, {"type": "thinking_delta", "thinking": "hmm"}),
            (1, {"type": "signature_delta", "signature": "c2ln"}),
            (2, {"type": "input_json_delta", "partial_json": '{"a": 1}'}),
            (0, {"type": "text_delta", "text": ""}),
        )
    ]
    assert fed == [[TextDelta("Hel")], [ReasoningDelta("hmm")], [], [], []]
    assert decoder._blocks[2].json_parts == ['{"a": 1}']


# -- the fast path and the full path agree --------------------------------------
# Valid events first, then, for some, one thing broken somewhere inside: a
# value of the wrong kind or a key taken away. Streams end with [DONE] (or
# message_stop), so what a decoder holds back is compared too.

WRONG = st.one_of(
    st.integers(-2, 2),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=2),
    st.none(),
    st.lists(st.none(), max_size=1),
    st.fixed_dictionaries({"x": st.none()}),
)
TEXT = st.text(st.sampled_from("ab {}\"'\\é"), max_size=4)
MAYBE_TEXT = st.one_of(st.none(), TEXT)


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


def places_in(value: object) -> list[tuple[dict[str, Any] | list[Any], Any]]:
    """Every (container, key) inside ``value``, depth first."""
    places: list[tuple[dict[str, Any] | list[Any], Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            places.append((value, key))
            places += places_in(item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            places.append((value, index))
            places += places_in(item)
    return places


@st.composite
def slightly_malformed(
    draw: st.DrawFn, valid: st.SearchStrategy[Any], *, always: bool = False
) -> object:
    """A value of ``valid``, or one with a single thing broken inside it.

    Broken rarely unless ``always``: a stream ends at its first error, and
    the paths worth comparing lie behind a run of good events.
    """
    value = copy.deepcopy(draw(valid))  # st.just() hands out one object
    if not always and draw(st.integers(0, 9)) != 0:
        return value
    places = places_in(value)
    if not places or draw(st.integers(0, 9)) == 0:
        return draw(WRONG)  # the whole payload
    container, key = draw(st.sampled_from(places))
    if isinstance(container, dict) and draw(st.booleans()):
        del container[key]
    else:
        container[key] = draw(WRONG)
    return value


def as_data(payload: object, layout: str = "plain") -> str:
    """``payload`` as event data; some layouts only json.loads takes whole."""
    if isinstance(payload, str):
        return payload
    text = json.dumps(payload)
    return {
        "plain": text,
        "trailing text": f"{text}x",
        "leading space": f" {text}",
        "trailing newline": f"{text}\n",
        "indented": json.dumps(payload, indent=1),
    }[layout]


# Mostly plain: trailing text ends a stream.
LAYOUT = st.sampled_from(
    ["plain"] * 26 + ["trailing text", "leading space", "trailing newline", "indented"]
)


RECORDED = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "decoder_outcomes.json").read_text(
        "utf-8"
    )
)


def outcome(decoder: WireDecoder, sse: ServerSentEvent | None) -> dict[str, Any]:
    """What feeding ``sse`` (or ending the stream, for ``None``) gives, as recorded."""
    try:
        events = decoder.end_of_stream() if sse is None else decoder.feed(sse)
    except ProviderError as error:
        name = type(error).__name__
        return {"error": [name, list(error.args), error.status_code, error.retryable]}
    return {"events": [repr(event) for event in events]}


def outcomes(
    decoder: WireDecoder, events: list[ServerSentEvent]
) -> list[dict[str, Any]]:
    """Feed ``events``, then the end: each step's outcome, up to an error."""
    found: list[dict[str, Any]] = []
    for sse in [*events, None]:
        found.append(outcome(decoder, sse))
        if "error" in found[-1]:
            break  # an error ends the stream
    return found


def recorded(steps: list[int]) -> list[object]:
    """The outcomes a recording lists by number."""
    return [RECORDED["steps"][step] for step in steps]


def assert_sound(decoder: WireDecoder, events: list[ServerSentEvent]) -> None:
    """Stream events, then the terminator or a ``ProviderError`` naming the provider.

    Anything else raised fails the test as it is: an event that fits its
    shape but is refused as misfitting it trips the decoder's assertion.
    """
    steps = outcomes(decoder, events)
    last = steps[-1]
    if "error" in last:
        assert last["error"][1][0].startswith(f"{decoder._provider}: "), last
    else:
        assert decoder.done  # every stream here ends with its terminator


@pytest.mark.parametrize(
    "stream", RECORDED["streams"], ids=lambda stream: stream["format"]
)
def test_recorded_streams_give_the_recorded_outcomes(stream: dict[str, Any]) -> None:
    decoder: WireDecoder = (
        OpenAIDecoder("openai")
        if stream["format"] == "openai"
        else AnthropicDecoder("anthropic")
    )
    events = [ServerSentEvent(event=name, data=data) for name, data in stream["events"]]
    assert outcomes(decoder, events) == recorded(stream["outcome"])


OPENAI_TOOL_CALL = st.fixed_dictionaries(
    {"index": st.integers(0, 2)},
    optional={
        "id": MAYBE_TEXT,
        "type": st.just("function"),
        "function": st.one_of(
            optional(name=MAYBE_TEXT, arguments=MAYBE_TEXT), st.none()
        ),
    },
)
OPENAI_DELTA = optional(
    role=st.just("assistant"),
    content=MAYBE_TEXT,
    reasoning_content=MAYBE_TEXT,
    reasoning=MAYBE_TEXT,
    tool_calls=st.one_of(st.lists(OPENAI_TOOL_CALL, max_size=2), st.none()),
    refusal=st.none(),
)
OPENAI_CHOICE = st.fixed_dictionaries(
    {"delta": OPENAI_DELTA},
    optional={
        "index": st.sampled_from([0, 0, 0, 1]),
        "finish_reason": st.sampled_from([None, None, None, "stop", "tool_calls"]),
        "logprobs": st.none(),
    },
)
OPENAI_USAGE = st.fixed_dictionaries(
    {"prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9)},
    optional={"prompt_tokens_details": optional(cached_tokens=st.integers(0, 9))},
)
OPENAI_CHUNK = st.fixed_dictionaries(
    {
        "choices": st.one_of(
            st.lists(OPENAI_CHOICE, min_size=1, max_size=1),
            st.lists(OPENAI_CHOICE, max_size=2),
        )
    },
    optional={
        "id": st.just("chatcmpl-1"),
        "object": st.just("chat.completion.chunk"),
        "usage": st.one_of(st.none(), OPENAI_USAGE),
        "error": st.none(),
    },
)
# What ends a stream, or may: rare, or no stream would get far.
OPENAI_ODD = st.one_of(
    st.sampled_from(["[DONE]", "", " ", "{not json", "[[1]"]),
    OPENAI_CHUNK.map(lambda chunk: {**chunk, "object": "error", "message": "m"}),
    OPENAI_CHUNK.map(lambda chunk: {**chunk, "error": {"message": "m", "code": 500}}),
)
OPENAI_EVENT = st.tuples(
    st.one_of(*[slightly_malformed(OPENAI_CHUNK)] * 12, OPENAI_ODD),
    LAYOUT,
    st.sampled_from([None] * 20 + ["message", "error"]),
)


@given(st.lists(OPENAI_EVENT, min_size=1, max_size=12))
def test_openai_streams_yield_events_or_provider_errors(
    chunks: list[tuple[object, str, str | None]],
) -> None:
    events = [
        ServerSentEvent(event=name or "message", data=as_data(payload, layout))
        for payload, layout, name in chunks
    ]
    events.append(ServerSentEvent(data="[DONE]"))
    assert_sound(OpenAIDecoder("openai"), events)


ANTHROPIC_INDEX = st.integers(0, 2)
ANTHROPIC_DELTA = st.one_of(
    st.fixed_dictionaries({"type": st.just("text_delta"), "text": TEXT}),
    st.fixed_dictionaries({"type": st.just("thinking_delta"), "thinking": TEXT}),
    st.fixed_dictionaries({"type": st.just("input_json_delta"), "partial_json": TEXT}),
    st.fixed_dictionaries({"type": st.just("signature_delta"), "signature": TEXT}),
).flatmap(
    # Now and then a field that belongs to another kind of delta.
    lambda delta: st.fixed_dictionaries(
        {key: st.just(value) for key, value in delta.items()},
        optional={
            key: MAYBE_TEXT for key in ("text", "partial_json") if key not in delta
        },
    )
)
ANTHROPIC_BLOCK_DELTA = st.fixed_dictionaries(
    {
        "type": st.just("content_block_delta"),
        "index": ANTHROPIC_INDEX,
        "delta": ANTHROPIC_DELTA,
    }
)
ANTHROPIC_BLOCK_START = st.fixed_dictionaries(
    {
        "type": st.just("content_block_start"),
        "index": ANTHROPIC_INDEX,
        "content_block": st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
            st.fixed_dictionaries({"type": st.just("thinking"), "thinking": TEXT}),
            st.fixed_dictionaries(
                {"type": st.just("tool_use"), "id": TEXT, "name": TEXT}
            ),
        ),
    }
)
ANTHROPIC_OTHER = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("content_block_stop"), "index": ANTHROPIC_INDEX}
    ),
    st.just({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
    st.fixed_dictionaries(
        {
            "type": st.just("message_delta"),
            "delta": optional(stop_reason=st.sampled_from(["end_turn", "tool_use"])),
        },
        optional={"usage": optional(output_tokens=st.integers(0, 9))},
    ),
    st.just({"type": "ping"}),
    st.sampled_from(
        [
            {"type": "ping"},
            {"type": "error", "error": {"type": "overloaded_error", "message": "m"}},
        ]
    ),
)
ANTHROPIC_EVENT = st.tuples(
    st.one_of(
        *[slightly_malformed(ANTHROPIC_BLOCK_DELTA)] * 8,
        *[ANTHROPIC_BLOCK_START] * 4,
        *[slightly_malformed(ANTHROPIC_OTHER)] * 3,
        st.sampled_from(["", "", "", "{not json"]),
    ),
    LAYOUT,
)
ANTHROPIC_END = [
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
    {"type": "message_stop"},
]


@given(st.lists(ANTHROPIC_EVENT, min_size=1, max_size=16))
def test_anthropic_streams_yield_events_or_provider_errors(
    payloads: list[tuple[object, str]],
) -> None:
    events = [
        ServerSentEvent(
            event=str(payload.get("type", "message"))
            if isinstance(payload, dict)
            else "message",
            data=as_data(payload, layout),
        )
        for payload, layout in [*payloads, *((end, "plain") for end in ANTHROPIC_END)]
    ]
    assert_sound(AnthropicDecoder("anthropic"), events)


# One event broken anywhere, between a set-up and an ending that bring out
# whatever it left behind: every field of the fast path's checks gets hit.

OPENAI_FINISH = {
    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2},
}


@given(slightly_malformed(OPENAI_CHUNK, always=True), LAYOUT)
def test_openai_one_broken_chunk_gives_events_or_a_provider_error(
    payload: object, layout: str
) -> None:
    start = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}
    events = [
        event({"choices": [{"delta": {"tool_calls": [start]}}]}),
        ServerSentEvent(data=as_data(payload, layout)),
        event(OPENAI_FINISH),
        event("[DONE]"),
    ]
    assert_sound(OpenAIDecoder("openai"), events)


ANTHROPIC_SETUP = [
    {"type": "message_start", "message": {"usage": {"input_tokens": 3}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "thinking", "thinking": ""},
    },
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f"},
    },
]


@given(
    slightly_malformed(ANTHROPIC_BLOCK_DELTA, always=True),
    LAYOUT,
    st.lists(ANTHROPIC_INDEX, max_size=2, unique=True),
)
def test_anthropic_one_broken_delta_gives_events_or_a_provider_error(
    payload: object, layout: str, stopped_first: list[int]
) -> None:
    stopped_after = [i for i in range(3) if i not in stopped_first]
    events = [
        *(event(data) for data in ANTHROPIC_SETUP),
        *(event({"type": "content_block_stop", "index": i}) for i in stopped_first),
        ServerSentEvent(data=as_data(payload, layout)),
        *(event({"type": "content_block_stop", "index": i}) for i in stopped_after),
        *(event(data) for data in ANTHROPIC_END),
    ]
    assert_sound(AnthropicDecoder("anthropic"), events)


# Every field of the shapes the fast paths take, broken every way, in turn:
# the hypothesis tests above wander; this one leaves no field out.

REPLACEMENTS: list[object] = [None, 0, 1, True, 1.5, "", "x", "error", [], {}, [None]]
DELETE = object()


def broken_copies(value: object) -> list[tuple[str, object]]:
    """``value`` with each place in it deleted or replaced, one at a time."""
    copies: list[tuple[str, object]] = [("as it is", value)]
    for index in range(len(places_in(value))):
        for replacement in [DELETE, *REPLACEMENTS]:
            broken = copy.deepcopy(value)
            container, key = places_in(broken)[index]
            if replacement is DELETE:
                if not isinstance(container, dict):
                    continue
                del container[key]
            else:
                container[key] = replacement
            what = "deleted" if replacement is DELETE else repr(replacement)
            copies.append((f"{key!r} {what}", broken))
    return copies


OPENAI_FULL_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "choices": [
        {
            "index": 0,
            "delta": {
                "role": "assistant",
                "content": "a",
                "reasoning_content": "r",
                "reasoning": "s",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
            "logprobs": None,
            "finish_reason": None,
        }
    ],
    "usage": None,
    "error": None,
}


@pytest.mark.parametrize("layout", ["plain", "trailing text", "trailing newline"])
@pytest.mark.parametrize("name", [None, "message", "error"])
def test_openai_every_field_broken_gives_the_recorded_outcome(
    name: str | None, layout: str
) -> None:
    expected = RECORDED["every_field_broken"][f"openai {name} {layout}"]
    copies = broken_copies(OPENAI_FULL_CHUNK)
    assert len(copies) == len(expected)
    for (what, payload), steps in zip(copies, expected, strict=True):
        broken = ServerSentEvent(event=name or "message", data=as_data(payload, layout))
        events = [broken, event(OPENAI_FINISH), event("[DONE]")]
        assert outcomes(OpenAIDecoder("openai"), events) == recorded(steps), what


ANTHROPIC_DELTA_SHAPES = [
    # As the API sends them, then with every field the full path checks.
    {"type": "text_delta", "text": "a"},
    {"type": "thinking_delta", "thinking": "b"},
    {"type": "input_json_delta", "partial_json": "c"},
    *(
        {"type": kind, "text": "a", "thinking": "b", "partial_json": "c"}
        for kind in ("text_delta", "thinking_delta", "input_json_delta", "x_delta")
    ),
]


@pytest.mark.parametrize("shape", range(len(ANTHROPIC_DELTA_SHAPES)))
@pytest.mark.parametrize("index", [0, 1, 2, 3])
@pytest.mark.parametrize("layout", ["plain", "trailing text"])
def test_anthropic_every_field_broken_gives_the_recorded_outcome(
    shape: int, index: int, layout: str
) -> None:
    expected = RECORDED["every_field_broken"][f"anthropic {shape} {index} {layout}"]
    delta = ANTHROPIC_DELTA_SHAPES[shape]
    payload = {"type": "content_block_delta", "index": index, "delta": delta}
    copies = broken_copies(payload)
    assert len(copies) == len(expected)
    for (what, broken), steps in zip(copies, expected, strict=True):
        events = [
            *(event(data) for data in ANTHROPIC_SETUP),
            # Block 2 has stopped; block 3 never started.
            event({"type": "content_block_stop", "index": 2}),
            ServerSentEvent(data=as_data(broken, layout)),
            *(event({"type": "content_block_stop", "index": i}) for i in (0, 1)),
            *(event(data) for data in ANTHROPIC_END),
        ]
        got = outcomes(AnthropicDecoder("anthropic"), events)
        assert got == recorded(steps), what


# -- what the decoders refuse: nesting past the parser, a block stopped twice ------

DEEP = "[" * 100_000


@pytest.mark.parametrize(
    "decoder",
    [OpenAIDecoder("openai"), AnthropicDecoder("anthropic")],
    ids=["openai", "anthropic"],
)
def test_deeply_nested_event_data_is_a_malformed_stream(
    decoder: OpenAIDecoder | AnthropicDecoder,
) -> None:
    with pytest.raises(MalformedStream):
        decoder.feed(ServerSentEvent(event="ping", data=DEEP))


def _anthropic_events(*events: tuple[str, dict[str, Any]]) -> list[ServerSentEvent]:
    return [ServerSentEvent(event=name, data=json.dumps(data)) for name, data in events]


TOOL_BLOCK = (
    "content_block_start",
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "t",
            "input": {},
        },
    },
)
STOP_BLOCK = ("content_block_stop", {"type": "content_block_stop", "index": 0})


def test_a_content_block_stopped_twice_is_malformed_not_two_tool_calls() -> None:
    decoder = AnthropicDecoder("anthropic")
    events: list[StreamEvent] = []
    with pytest.raises(MalformedStream, match=r"content block 0 stopped twice"):
        for event in _anthropic_events(TOOL_BLOCK, STOP_BLOCK, STOP_BLOCK):
            events.extend(decoder.feed(event))
    assert [type(e) for e in events] == [ToolCall]


def test_a_delta_after_its_blocks_stop_is_malformed() -> None:
    decoder = AnthropicDecoder("anthropic")
    late = (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{}"},
        },
    )
    with pytest.raises(
        MalformedStream, match=r"a content_block_delta for block 0 after its stop"
    ):
        for event in _anthropic_events(TOOL_BLOCK, STOP_BLOCK, late):
            decoder.feed(event)
