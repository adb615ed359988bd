"""The fake server takes the keys the real APIs take, as the SDKs send them.

Anthropic's API takes ``x-api-key``, and a bearer ``Authorization``: the
official ``anthropic`` SDK (2.x) sends its ``api_key`` and its
``auth_token`` that way, so ``AsyncAnthropic`` must get through.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from trio_dispatch.testing import open_fake_llm_server

KEY = "sk-ant-right"
BODY = {"model": "m", "max_tokens": 8, "messages": [], "stream": True}
VERSION = {"anthropic-version": "2023-06-01"}


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"x-api-key": KEY}, 200),
        ({"authorization": f"Bearer {KEY}"}, 200),
        ({"authorization": f"bearer {KEY}"}, 200),
        ({"x-api-key": KEY, "authorization": "Bearer wrong"}, 200),
        ({"x-api-key": "wrong", "authorization": f"Bearer {KEY}"}, 401),
        ({"authorization": f"Basic {KEY}"}, 401),
        ({"authorization": "Bearer wrong"}, 401),
        ({"x-api-key": "", "authorization": f"Bearer {KEY}"}, 200),
        ({}, 401),
    ],
)
async def test_anthropic_takes_x_api_key_or_a_bearer_token(
    headers: dict[str, str], status: int
) -> None:
    async with (
        open_fake_llm_server(api_key=KEY) as server,
        httpx.AsyncClient() as client,
    ):
        response = await client.post(
            f"{server.anthropic_base_url}/v1/messages",
            json=BODY,
            headers={**VERSION, **headers},
        )
    assert response.status_code == status
    (request,) = server.requests
    assert request.authenticated is (status == 200)
    # Neither header is recorded: they hold the key.
    assert not {"authorization", "x-api-key"} & set(request.headers)


async def test_openai_still_takes_only_a_bearer_token() -> None:
    async with (
        open_fake_llm_server(api_key=KEY) as server,
        httpx.AsyncClient() as client,
    ):
        response = await client.post(
            f"{server.openai_base_url}/chat/completions",
            json={"model": "m", "messages": [], "stream": True},
            headers={"x-api-key": KEY},
        )
    assert response.status_code == 401


def sdk(base_url: str, credential: str, key: str) -> anthropic.AsyncAnthropic:
    """The Anthropic SDK's client, given ``key`` as its ``credential``."""
    if credential == "api_key":
        return anthropic.AsyncAnthropic(base_url=base_url, max_retries=0, api_key=key)
    return anthropic.AsyncAnthropic(base_url=base_url, max_retries=0, auth_token=key)


@pytest.mark.parametrize("credential", ["api_key", "auth_token"])
async def test_the_anthropic_sdk_gets_through_with_its_default_authentication(
    credential: str,
) -> None:
    async with open_fake_llm_server(api_key=KEY) as server:
        client = sdk(server.anthropic_base_url, credential, KEY)
        async with client:
            message = await client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
            )
            events = [event.type async for event in message]
        wrong = sdk(server.anthropic_base_url, credential, "nope")
        async with wrong:
            with pytest.raises(anthropic.AuthenticationError):
                await wrong.messages.create(
                    model="m",
                    max_tokens=8,
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                )
    assert events[0] == "message_start"
    assert events[-1] == "message_stop"
    assert [request.authenticated for request in server.requests] == [True, False]
