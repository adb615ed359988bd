"""The ``Dispatcher`` an application gets: the core, with its integrations.

``actors._dispatcher`` holds the dispatcher core (slots, turns, limits,
statistics, events), which imports nothing built on it. The integrations
(the HTTP transport, conversations) are built on the core's public names;
this front sits above them and adds the two methods that make them: the
class ``open_dispatcher`` makes, and ``trio_dispatch.Dispatcher``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, ParamSpec, final, overload

from .._conversations._conversation import start_conversation
from .._validation import check_provider
from ._dispatcher import Dispatcher as _Core
from ._open import open_dispatcher as _open_core

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from contextlib import AbstractAsyncContextManager

    import httpx
    import httpx2

    from .._conversations._conversation import Conversation
    from .._conversations._options import ConversationOptions
    from .._conversations._tools import Tool
    from .._provider import Provider
    from ..messages import ChatMessage

    MakeTransport = Callable[
        [_Core, str], httpx2.AsyncBaseTransport | httpx.AsyncBaseTransport
    ]

_P = ParamSpec("_P")


@final
class Dispatcher(_Core):
    """Per-provider concurrency limits, granted oldest turn first.

    Made by ``open_dispatcher``; valid inside its ``async with`` block. Each
    provider has its own scheduler actor, started when it is first limited or
    used. A provider without a limit is unlimited: its scheduler grants every
    request at once, but still counts the slots in use, so a limit set later
    counts them too (they finish; nothing new is granted above the limit).
    The scheduler of an unlimited provider stops when no slot is held and
    nothing waits, and starts again on the next request, so names used once
    (model ids, say) leave no task behind; its counters carry on.

    A provider is *known* once it is named in ``limits``, given a limit with
    ``set_limit``, or made unlimited on purpose with ``remove_limit`` (it
    stays known). A slot of any other provider is unlimited by accident, as
    a misspelt name would be: ``unknown_providers`` says what happens then.

    A dispatcher belongs to the trio run that opened it: used from another
    run (a ``trio.run`` in another thread), it raises ``RuntimeError`` at
    once, before anything reaches its own run (see ``check_run``). Other
    threads call into its run with ``trio.from_thread.run``.
    """

    __slots__ = ()

    @overload
    def transport(
        self, provider: str, *, inner: httpx.AsyncBaseTransport
    ) -> httpx.AsyncBaseTransport: ...

    @overload
    def transport(
        self, provider: str, *, inner: httpx2.AsyncBaseTransport | None = None
    ) -> httpx2.AsyncBaseTransport: ...

    def transport(
        self,
        provider: str,
        *,
        inner: httpx2.AsyncBaseTransport | httpx.AsyncBaseTransport | None = None,
    ) -> httpx2.AsyncBaseTransport | httpx.AsyncBaseTransport:
        """An HTTP transport whose model calls each hold a slot of ``provider``.

        Give it to the client an SDK uses (``httpx2.AsyncClient(transport=
        dispatcher.transport("openai"))``), and make the SDK's calls inside
        ``turn()``: a call's place in line is its turn's start, so every
        call of an agent's turn, each retry too, goes before younger
        turns. Outside any turn, each request is a turn of its own, ranked
        when it asks: first come, first served per call.

        A model call (a ``POST`` whose path ends in ``/chat/completions``,
        ``/completions``, ``/responses``, ``/messages``, ``/complete`` or
        ``/embeddings``) takes a slot before its first byte is sent and gives it back when
        its response is closed: after the last byte, or when it is closed
        early, fails or is cancelled. Anything else (``GET /models``,
        files, batches, token counts) passes without a slot. A 429, 503 or
        529 answer to a model call pauses the provider (``Retry-After``,
        ``retry-after-ms``, see ``report_rate_limit``); the answer goes
        back to the caller unchanged. Inside a ``turn()``, such a call
        keeps the turn's place for its retry: a request with the turn's
        rank waits through the pause, and once granted holds the slot for
        the SDK's retry (made in the same turn, for the same model) at
        most ``retry_grace`` seconds (see ``open_dispatcher``); leaving
        the turn drops it at once. A call whose JSON body names a
        ``model`` takes its slot for that model (``slot(model=...)``): a
        budget ``"provider/model"`` must hold it too. Every answer's
        rate-limit headers (``x-ratelimit-*`` or
        ``anthropic-ratelimit-*``) go to ``observe_rate_limits``, for the
        call's model, and a call whose JSON body has
        ``messages`` is charged its estimated tokens (prompt and
        ``max_tokens``), not corrected from its usage, which only the SDK
        reads. The slot is the current turn's, as
        with ``slot()`` without ``started_at``. ``max_hold`` bounds a model
        call from its grant to its response's close: past it, the request
        or the read under way fails with ``SlotHoldTimeout``, a response
        that nobody reads is closed, and the slot goes back. A response
        dropped without being closed gives its slot back when it is
        garbage-collected, with a ``ResourceWarning`` naming the provider.

        Args:
            provider: The provider's name: whose slots the calls take.
            inner: The transport that sends the requests:
                ``httpx2.AsyncHTTPTransport()`` if ``None``. Given a legacy
                ``httpx.AsyncBaseTransport``, the result is one too.

        Raises:
            TypeError: ``provider`` is not a string, or ``inner`` is not an
                httpx2 or httpx async transport. Later, from a request of
                the other httpx's client (an ``httpx.AsyncClient`` given a
                transport made without ``inner``), before any slot.
            ValueError: ``provider`` is empty, or unknown while the
                dispatcher's ``unknown_providers`` is ``"error"``.
        """
        check_provider(provider)
        make = _transport_for(inner)
        self.check_known(provider)
        return make(self, provider)

    def start_conversation(
        self,
        provider: Provider,
        *,
        conversation_id: str | None = None,
        tools: Iterable[Tool] = (),
        system_prompt: str | None = None,
        options: ConversationOptions | None = None,
        history: Iterable[ChatMessage] = (),
        priority: int = 0,
        tenant: str | None = None,
    ) -> Conversation:
        """Start a conversation actor with ``provider`` in this dispatcher.

        Every LLM call it makes takes a slot of ``provider.id`` first (see
        ``Conversation``). The actor runs until ``Conversation.close()`` or
        until the dispatcher closes. Arguments are checked here, at once.

        Args:
            provider: Any ``Provider`` (an ``id`` and a ``stream`` method).
            conversation_id: Its name (``Conversation.id``, and the
                ``conversation_id`` of every slot it takes); a fresh
                unique one if not given.
            tools: The ``Tool`` values the model may call (distinct names).
            system_prompt: Sent as ``ChatRequest.system`` with every request;
                never part of the history.
            options: Retries, backoff, compaction, ``max_tokens``, the
                request options of its turns (``request_options``) and the
                jitter's seed, as a ``ConversationOptions``; ``None`` for the
                defaults.
            history: The messages to start from, oldest first: the
                ``history`` of an earlier conversation, or what
                ``load_history`` read back. Checked here: a tool call
                without its result, or a result without its call, is
                refused (see ``load_history``).
            priority: The priority class of its turns (an int, higher
                first): each turn runs in a ``turn()`` of this class.
            tenant: The tenant of its turns (see ``open_dispatcher``'s
                ``tenants``): each turn runs in a ``turn()`` of this
                tenant. Defaults to the tenant of the turn current here,
                at the call, or none.

        Raises:
            ValueError: ``provider.id`` is unknown and the dispatcher's
                ``unknown_providers`` is ``"error"``; or a bad argument.
            DispatcherClosed: The dispatcher has closed.
        """
        return start_conversation(
            self,
            provider,
            conversation_id=conversation_id,
            tools=tools,
            system_prompt=system_prompt,
            options=options,
            history=history,
            priority=priority,
            tenant=tenant,
        )


def _transport_for(inner: object) -> MakeTransport:
    """How to make a transport around ``inner``; TypeError if it is no transport.

    ``None`` is a new ``httpx2.AsyncHTTPTransport``, made only once the
    call's other checks have passed. httpx2 is imported only now, when a
    transport is asked for.
    """
    import httpx2  # noqa: PLC0415  # only when a transport is asked for

    from .._integrations._transport import DispatchTransport  # noqa: PLC0415  # imports httpx2

    if inner is None:
        return lambda dispatcher, provider: DispatchTransport(
            dispatcher, provider, httpx2.AsyncHTTPTransport()
        )
    if isinstance(inner, httpx2.AsyncBaseTransport):
        checked = inner
        return lambda dispatcher, provider: DispatchTransport(
            dispatcher, provider, checked
        )
    # An httpx transport exists only if httpx was imported: do not import it
    # just to say no.
    legacy = sys.modules.get("httpx")
    if legacy is not None and isinstance(inner, legacy.AsyncBaseTransport):
        from .._integrations._transport_legacy import LegacyDispatchTransport  # noqa: PLC0415

        old = inner
        return lambda dispatcher, provider: LegacyDispatchTransport(
            dispatcher, provider, old
        )
    raise TypeError(
        "inner must be an httpx2.AsyncBaseTransport or an httpx.AsyncBaseTransport,"
        f" got {type(inner).__name__}"
    )


def _opens_the_front(
    opener: Callable[_P, AbstractAsyncContextManager[_Core]],
) -> Callable[_P, AbstractAsyncContextManager[Dispatcher]]:
    """The core's ``open_dispatcher``, typed as what it makes: this front."""
    return opener  # type: ignore[return-value]  # _Core._front is Dispatcher: see _Core.__init_subclass__


open_dispatcher = _opens_the_front(_open_core)
