"""Request options: checked when made, merged per turn, and on the wire."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from trio_dispatch import ConversationOptions, RequestOptions, open_dispatcher
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.testing import FakeReply, FakeScript, ScriptedProvider

from .._rigs import open_rig, quick

CONVERSATION = RequestOptions(
    temperature=0.3,
    top_p=0.9,
    max_tokens=64,
    stop=["END"],
    extra={"seed": 7, "metadata": {"user": "ana"}},
)
TURN = RequestOptions(temperature=1.5, stop=("STOP", "\n"), extra={"seed": 8})


# -- on the wire ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "stop_field"), [("openai", "stop"), ("anthropic", "stop_sequences")]
)
async def test_request_options_reach_the_wire_and_a_turn_overrides_them(
    wire: str, stop_field: str
) -> None:
    async with open_rig(FakeScript(default=FakeReply(text="ok")), wire=wire) as rig:
        conversation = rig.start(options=quick(request_options=CONVERSATION))
        await conversation.ask("first")
        await conversation.ask("second", options=TURN)
        async with conversation.stream("third", options=TURN) as turn:
            async for _event in turn:
                pass
        await conversation.ask("fourth")
    first, second, third, fourth = (request.body for request in rig.server.requests)
    expected_first = {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 64,
        stop_field: ["END"],
        "seed": 7,
        "metadata": {"user": "ana"},
    }
    assert {key: first[key] for key in expected_first} == expected_first
    expected_turn = {
        "temperature": 1.5,
        "top_p": 0.9,
        "max_tokens": 64,
        stop_field: ["STOP", "\n"],
        "seed": 8,
        "metadata": {"user": "ana"},
    }
    assert {key: second[key] for key in expected_turn} == expected_turn
    assert {key: third[key] for key in expected_turn} == expected_turn
    # A turn's options are its own: the next turn is back to the conversation's.
    assert fourth == {**first, "messages": fourth["messages"]}


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_no_request_options_send_no_sampling_fields(wire: str) -> None:
    async with open_rig(FakeScript(default=FakeReply(text="ok")), wire=wire) as rig:
        await rig.start().ask("hi")
    (request,) = rig.server.requests
    sent = set(request.body) & {"temperature", "top_p", "stop", "stop_sequences"}
    assert sent == set()


async def test_the_scripted_provider_sees_the_options_in_its_chat_request() -> None:
    provider = ScriptedProvider(FakeScript(default=FakeReply(text="ok")), id="memory")
    options = ConversationOptions(request_options=CONVERSATION)
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        await conversation.ask("hi", options=TURN)
    (request,) = provider.requests
    assert (
        request.temperature,
        request.top_p,
        request.max_tokens,
        request.stop,
        request.extra,
    ) == (1.5, 0.9, 64, ("STOP", "\n"), {"seed": 8, "metadata": {"user": "ana"}})


async def test_conversation_max_tokens_applies_unless_a_turn_sets_its_own() -> None:
    provider = ScriptedProvider(FakeScript(default=FakeReply(text="ok")), id="memory")
    options = ConversationOptions(max_tokens=32)
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        await conversation.ask("hi")
        await conversation.ask("hi", options=RequestOptions(max_tokens=8))
    assert [request.max_tokens for request in provider.requests] == [32, 8]


# -- checked when made ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"temperature": -0.1}, ValueError, r"temperature must be a number from 0 to 2, got -0\.1"),
        ({"temperature": 2.5}, ValueError, r"temperature must be a number from 0 to 2, got 2\.5"),
        ({"temperature": math.nan}, ValueError, r"temperature must be a number from 0 to 2, got nan"),
        ({"temperature": "0.5"}, TypeError, r"temperature must be a number from 0 to 2, got '0\.5'"),
        ({"temperature": True}, TypeError, r"temperature must be a number from 0 to 2, got True"),
        ({"top_p": 0}, ValueError, r"top_p must be a number above 0 and at most 1, got 0"),
        ({"top_p": 1.01}, ValueError, r"top_p must be a number above 0 and at most 1, got 1\.01"),
        ({"top_p": None, "max_tokens": 0}, ValueError, r"max_tokens must be a positive integer, got 0"),
        ({"max_tokens": 1.5}, TypeError, r"max_tokens must be a positive integer, got 1\.5"),
        ({"stop": "END"}, TypeError, r"stop must be a tuple of strings, got 'END'"),
        ({"stop": ("END", 1)}, TypeError, r"stop must be a tuple of strings, got 1 in it"),
        ({"stop": ("END", "")}, ValueError, r"stop sequences must be non-empty strings, got ''"),
        ({"stop": ()}, ValueError, r"stop must hold at least one string, got \(\)"),
        ({"extra": [("seed", 1)]}, TypeError, r"extra must be a mapping of field names to JSON, got \[\('seed', 1\)\]"),
        ({"extra": {1: "x"}}, TypeError, r"extra keys must be non-empty strings, got 1"),
        ({"extra": {"": "x"}}, ValueError, r"extra keys must be non-empty strings, got ''"),
        ({"extra": {"seed": math.inf}}, ValueError, r"extra\['seed'\] must be JSON, got inf"),
        ({"extra": {"meta": {"a": [1, {2}]}}}, TypeError, r"extra\['meta'\]\['a'\]\[1\] must be JSON, got set"),
        ({"extra": {"meta": {1: 2}}}, TypeError, r"extra\['meta'\] must be JSON, got the key 1"),
    ],
)  # fmt: skip
def test_bad_request_options_are_refused_when_made(
    fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=rf"^{message}$"):
        RequestOptions(**fields)


@pytest.mark.parametrize(
    "key",
    [
        "model",
        "messages",
        "system",
        "stream",
        "stream_options",
        "tools",
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "stop_sequences",
    ],
)
def test_extra_refuses_the_fields_the_request_sets_itself(key: str) -> None:
    message = rf"^extra must not set '{key}': the request sets it$"
    with pytest.raises(ValueError, match=message):
        RequestOptions(extra={key: 1})
    with pytest.raises(ValueError, match=message):
        ChatRequest([ChatMessage("user", "x")], extra={key: 1})


def test_extra_is_copied_when_made() -> None:
    metadata: dict[str, Any] = {"tags": ["a"]}
    options = RequestOptions(extra={"metadata": metadata})
    metadata["tags"].append("b")
    assert options.extra == {"metadata": {"tags": ["a"]}}


def test_request_options_are_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        CONVERSATION.temperature = 1.0  # type: ignore[misc]  # the point of the test


def test_conversation_options_refuse_max_tokens_set_twice() -> None:
    with pytest.raises(
        ValueError,
        match=r"^max_tokens must be set in ConversationOptions"
        r" or in its request_options, not both$",
    ):
        ConversationOptions(max_tokens=5, request_options=RequestOptions(max_tokens=6))


def test_conversation_options_refuse_request_options_of_another_type() -> None:
    with pytest.raises(
        TypeError, match=r"^request_options must be a RequestOptions, got \{\}$"
    ):
        ConversationOptions(request_options={})  # type: ignore[arg-type]  # the point of the test


async def test_a_turns_options_of_another_type_are_refused_at_the_call() -> None:
    provider = ScriptedProvider(FakeScript(default=FakeReply(text="ok")), id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        message = r"^options must be a RequestOptions, got \{'temperature': 1\}$"
        with pytest.raises(TypeError, match=message):
            await conversation.ask("hi", options={"temperature": 1})  # type: ignore[arg-type]  # the point of the test
        with pytest.raises(TypeError, match=message):
            conversation.stream("hi", options={"temperature": 1})  # type: ignore[arg-type]  # the point of the test
        assert conversation.history == ()
    assert provider.requests == []
