"""One process of a fleet sharing a provider through Redis, for the fleet tests.

Run as ``python -m tests._fleet_worker '<json settings>'``. It prints one
JSON line on stdout when it is ready (``{"ready": ...}``) and, in
``conversations`` mode, one when it is done (``{"turns": ...}``).

Modes:

* ``conversations``: ``count`` conversations with the fake server at
  ``base_url``, each asking ``questions`` questions; every turn must
  complete (a conversation retries what the server refuses).
* ``hold``: take ``count`` slots and hold them until killed; with a
  ``tenant`` (and ``tenants``, name to weight and cap), ``count`` requests
  of that tenant, ready once ``held`` of them hold a slot and a lease has
  passed (the others may wait: a cap).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import trio

from trio_dispatch import ConversationOptions, Tenant, open_dispatcher
from trio_dispatch.providers import OpenAIProvider


def say(**fields: Any) -> None:  # noqa: ANN401  # JSON values
    print(json.dumps(fields), flush=True)


def backend(settings: dict[str, Any]) -> dict[str, Any]:
    """The shared backend's arguments, or none for a dispatcher of its own."""
    if settings["redis_url"] is None:
        return {}
    keys = ("redis_url", "namespace", "lease")
    return {key: settings[key] for key in keys}


async def conversations(settings: dict[str, Any]) -> None:
    provider = OpenAIProvider(
        base_url=settings["base_url"], api_key="test-key", model="fake"
    )
    async with (
        provider,
        open_dispatcher(
            {provider.id: settings["limit"]},
            **backend(settings),
        ) as dispatcher,
    ):
        say(ready=True)
        turns = 0

        async def agent(n: int) -> None:
            nonlocal turns
            conversation = dispatcher.start_conversation(
                provider,
                conversation_id=f"{settings['name']}-{n}",
                options=ConversationOptions(max_attempts=10, retry_backoff=0.05),
            )
            for q in range(settings["questions"]):
                await conversation.ask(f"q{n}-{q}")
                turns += 1

        async with trio.open_nursery() as nursery:
            for n in range(settings["count"]):
                nursery.start_soon(agent, n)
        say(turns=turns)


async def hold(settings: dict[str, Any]) -> None:
    tenant = settings.get("tenant")
    tenants = {
        name: Tenant(weight=weight, limit=limit)
        for name, (weight, limit) in settings.get("tenants", {}).items()
    }
    async with open_dispatcher(
        {"p": settings["limit"]},
        tenants=tenants,
        **backend(settings),
    ) as dispatcher:
        if tenant is None:
            slots = [dispatcher.slot("p") for _ in range(settings["count"])]
            for slot in slots:
                await slot.__aenter__()
            say(ready=True, held=len(slots))
            await trio.sleep_forever()
        # Requests of a tenant, each in a task of its own (its cap may keep
        # some waiting): ready once ``held`` of them hold a slot.
        held = 0
        enough = trio.Event()

        async def take() -> None:
            nonlocal held
            async with dispatcher.slot("p", tenant=tenant):
                held += 1
                if held == settings["held"]:
                    enough.set()
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            for _ in range(settings["count"]):
                nursery.start_soon(take)
            await enough.wait()
            await trio.sleep(settings["lease"])
            say(ready=True, held=held)


def main() -> None:
    settings = json.loads(sys.argv[1])
    trio.run({"conversations": conversations, "hold": hold}[settings["mode"]], settings)


if __name__ == "__main__":
    main()
