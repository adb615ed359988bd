"""What every provider offers: an id, and a stream per request.

``stream(request)`` returns an async context manager, not an async
generator: trio cannot promise a generator's cleanup runs, but a context
manager's exit always does. So the rules are::

    async with provider.stream(request) as events:   # the request is sent here
        async for event in events:                    # mid-stream errors here
            ...
    # here the HTTP response is closed, however the block was left

Nothing is sent before ``__aenter__``. A status error (429, 500, 401...)
is raised from ``__aenter__``, before any event; errors once events flow
are raised from the iterator. The response is closed on exit whatever
happened: an error, a cancellation, or the consumer leaving early. That
is what lets the dispatcher take a slot before the request and give it
back after the last token.

What an answer says of the account's rate limits travels with it, so that
a dispatcher the call goes through learns without any wiring: the opened
stream (what ``__aenter__`` returns) may have a ``rate_limits`` attribute,
a ``RateLimitInfo`` of the answer's headers or ``None``, and a status
error carries them as ``ProviderError.rate_limits``. Both are optional
for a provider of your own; ``OpenAIProvider``, ``AnthropicProvider`` and
``ScriptedProvider`` have them. ``wrap_provider`` and conversations read
them off the answer and tell the dispatcher (``observe_rate_limits``,
and ``report_rate_limit`` for a ``RateLimited`` or ``Overloaded``). The
callbacks below are for a provider used without a dispatcher's slot: an
answer the dispatcher meters calls neither (``events()`` shows what it
said), so a provider given them and used through that dispatcher too is
counted once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

from ._policy._ratelimits import RateLimitInfo

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from .messages import ChatRequest, StreamEvent

RateLimitReporter: TypeAlias = Callable[[str, float | None], None]
"""Told ``(provider id, retry_after seconds or None)`` on a 429, 529 or 503.

Providers call it synchronously, before raising ``RateLimited`` or
``Overloaded`` (also for a rate-limit or overloaded error inside a stream).
Pass ``dispatcher.report_rate_limit`` to pause the provider's grants when
it is used without a slot of that dispatcher; calls through it report by
themselves.
"""

RateLimitObserver: TypeAlias = Callable[[str, RateLimitInfo], None]
"""Told ``(provider id, figures)`` for every answer that carries rate limits.

Providers call it synchronously with what the answer's rate-limit headers
say (``x-ratelimit-*``, ``anthropic-ratelimit-*``, ``Retry-After``), for a
success or an error alike, before the stream is returned or the error
raised. It must not block; an exception it raises is logged, and the call
goes on. Calls through a dispatcher need none: the figures travel with the
answer, and an answer the dispatcher meters does not call it (see the
module's notes).
"""

# What the wrong ``with`` on a provider's stream, or on a provider that
# closes its client, says (see ``_util.wrong_with``).
STREAM_USAGE: Final = (
    "stream() is an async context manager:"
    " use `async with provider.stream(request) as events`"
)
PROVIDER_USAGE: Final = (
    "{name} is an async context manager: use `async with {name}(...) as provider`"
)


class Provider(Protocol):
    """An LLM API that streams answers to chat requests."""

    @property
    def id(self) -> str:
        """The provider's id, as the dispatcher knows it (``"openai"``)."""
        ...

    def stream(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        """An async context manager that sends ``request`` on entry.

        It yields an async iterator of the answer's events and closes the
        response on exit. That iterator may have ``rate_limits``: what the
        answer said of the account's rate limits (optional; see the
        module's notes).
        """
        ...
