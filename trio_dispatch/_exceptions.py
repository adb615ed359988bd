"""The exceptions trio-dispatch raises: one small tree.

Catch ``DispatchError`` for anything the dispatcher or a provider refuses,
``ProviderError`` for anything that went wrong talking to an LLM API (and
read ``retryable`` to decide whether the same request may succeed if it is
sent again)::

    DispatchError
    ├── DispatcherClosed     the dispatcher has shut down; nothing was acquired
    ├── QueueFull            too many requests already wait for this provider
    ├── PoolRemoved          the pool the request waited for was removed
    ├── SlotHoldTimeout      a slot was held longer than max_hold; the body was
    │                        cancelled and the slot given back
    ├── LeaseLost            a slot's lease in Redis went unrenewed for a whole
    │                        lease; the body was cancelled, the slot given back
    ├── ConversationClosed   the conversation was closed, or its actor stopped,
    │                        before the answer
    ├── BackendUnavailable   the shared backend (Redis) cannot be reached at
    │                        open_dispatcher
    ├── TooManyToolRounds    the model kept calling tools past max_tool_rounds;
    │                        the turn failed and the history is unchanged
    ├── ServerLoadUnavailable          a server's own load could not be read
    │   │                              this time (no answer in time, not 200):
    │   │                              ignore it and read again later
    │   └── UnknownServerMetrics       the text is not one of the known servers'
    │                                  metrics (also a ValueError)
    └── ProviderError                  provider, status_code, retryable
        ├── RateLimited                429: too many requests     retryable
        ├── Overloaded                 529, 503: busy for everyone retryable
        ├── ServerError                any other 5xx               retryable
        ├── AuthenticationError        401, 403: the key           not retryable
        ├── BadRequest                 any other 4xx               not retryable
        ├── ProviderConnectionError    connect, read, timeout      retryable
        ├── StreamInterrupted          ended without its end       retryable
        ├── MalformedStream            an event that makes no sense retryable
        └── RequestFailed              on our side: JSON, client   not retryable

Bad arguments raise ``TypeError`` or ``ValueError`` at the call, before
anything changes; misuse raises ``RuntimeError`` (entering a slot twice,
opening a dispatcher under asyncio or outside any event loop, using one
from another trio run than its own), and the wrong ``with`` (``with`` for ``async with``, or the other way round) a
``TypeError`` that says which one to use.

One warning, beside the tree::

    UserWarning
    └── UnknownProviderWarning   a slot of a provider no limit names runs
                                 unlimited (a misspelt name?); once per name

The provider errors are the contract between the dispatcher's side and the
providers' side, so they live here, beside the rest, and importing them
loads no HTTP library. ``RateLimited`` and ``Overloaded`` carry
``retry_after`` (seconds, or ``None`` when the provider did not say), and
an error made from a status answer carries what that answer's headers said
of the account's limits (``rate_limits``), as an opened stream does. A
status error is raised when the stream is entered, before any event;
everything else that goes wrong once events flow is raised from the
iterator. Messages name the provider and say what happened; they never hold
an API key.

Nothing else escapes a provider's stream: a request that cannot be encoded
is ``RequestFailed`` from ``stream()`` itself, before anything is sent, and
whatever else the HTTP client raises becomes ``RequestFailed`` too, so one
bad call fails its turn and never the dispatcher. ``trio.Cancelled``,
``KeyboardInterrupt`` and every other ``BaseException`` pass untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, final

if TYPE_CHECKING:
    from ._policy._ratelimits import RateLimitInfo


class DispatchError(Exception):
    """Base class of every error trio-dispatch raises on its own account."""


@final
class DispatcherClosed(DispatchError):
    """The dispatcher has shut down, or did while the caller waited.

    A caller that sees this holds no slot.
    """


@final
class UnknownProviderWarning(UserWarning):
    """A provider no limit names was used, so it runs unlimited: a misspelt name?

    Issued once per name per dispatcher with ``unknown_providers="warn"``
    (the default), beside the log line, naming the provider, the limited
    providers, and the limited name it is close to, if any (``"opneai"``:
    did you mean ``'openai'``?). ``python -W error`` and pytest's
    ``filterwarnings = ["error"]`` turn it into an exception at the call
    that used the name; ``warnings.filterwarnings("ignore",
    category=UnknownProviderWarning)`` silences it, and ``remove_limit``
    makes a provider unlimited on purpose, without a warning.
    """


@final
class QueueFull(DispatchError):
    """More callers already wait for this provider than ``max_waiting`` allows.

    Raised at once, without waiting; the caller holds no slot.

    Attributes:
        provider: The provider whose queue is full, or ``None`` when the
            raiser did not say (a bare ``SlotPolicy`` made with no
            ``provider``, a backend of your own).
        max_waiting: The bound that was reached, or ``None`` when the
            raiser did not say.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str | None = None,
        max_waiting: int | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.max_waiting = max_waiting


@final
class PoolRemoved(DispatchError):
    """The pool a request waited for was removed (``Dispatcher.remove_pool``).

    Raised to each request waiting for it then; the caller holds no slot.

    Attributes:
        pool: The pool's name.
    """

    def __init__(self, message: str, *, pool: str) -> None:
        super().__init__(message)
        self.pool = pool


@final
class PoolUnreachable(DispatchError, ValueError):
    """No member of the pool is one this integration can send a call to.

    A transport has an ``Endpoint`` (a ``PoolProvider`` a provider) for
    some members; the pool's members are now others only (``set_pool``).
    Raised before any slot is taken; nothing is held. A ``ValueError`` too.

    Attributes:
        pool: The pool's name.
    """

    def __init__(self, message: str, *, pool: str) -> None:
        super().__init__(message)
        self.pool = pool


def queue_full(provider: str | None, waiting: int, max_waiting: int) -> QueueFull:
    """The ``QueueFull`` of a queue of ``provider`` where ``waiting`` already wait."""
    verb = "request already waits" if waiting == 1 else "requests already wait"
    where = "" if provider is None else f" for {provider!r}"
    return QueueFull(
        f"{waiting} {verb}{where} (max_waiting={max_waiting})",
        provider=provider,
        max_waiting=max_waiting,
    )


@final
class SlotHoldTimeout(DispatchError):
    """A slot was held past ``max_hold``.

    The body of the ``async with`` was cancelled when the time ran out, and
    the slot went back to the scheduler as the body unwound.

    Attributes:
        provider: The provider whose slot was held too long, or ``None``
            when the raiser did not say.
        max_hold: The seconds a slot may be held, or ``None`` when the
            raiser did not say.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str | None = None,
        max_hold: float | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.max_hold = max_hold


def slot_hold_timeout(provider: str, max_hold: float) -> SlotHoldTimeout:
    """The ``SlotHoldTimeout`` of a slot of ``provider`` held past ``max_hold``."""
    return SlotHoldTimeout(
        f"a slot of {provider!r} was held longer than max_hold={max_hold:g} seconds",
        provider=provider,
        max_hold=max_hold,
    )


@final
class BackendUnavailable(DispatchError):
    """``open_dispatcher`` could not reach its shared backend (Redis).

    The message names the URL without its credentials. Nothing was started.
    Once running, a dispatcher never raises this: while Redis is away it
    grants nothing new and says so in ``statistics()``.
    """


@final
class LeaseLost(DispatchError):
    """A slot shared through Redis went a whole ``lease`` without renewal.

    Its process could not reach Redis for that long (a partition, a loop
    blocked), so the fleet may already have granted the slot again: the
    body of the ``async with`` was cancelled when the time ran out, and the
    slot went back as the body unwound. A call through
    ``Dispatcher.transport`` has its response body closed instead, and its
    next read raises this.

    Attributes:
        provider: The provider whose slot's lease ran out, or ``None``
            when the raiser did not say.
        lease: The seconds a lease lives without renewal, or ``None`` when
            the raiser did not say.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str | None = None,
        lease: float | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.lease = lease


def lease_lost(provider: str, lease: float) -> LeaseLost:
    """The ``LeaseLost`` of a slot of ``provider`` whose ``lease`` ran out."""
    return LeaseLost(
        f"the lease of a slot of {provider!r} went {lease:g} seconds without renewal",
        provider=provider,
        lease=lease,
    )


@final
class ConversationClosed(DispatchError):
    """The conversation was closed, or its actor stopped, before the answer.

    Raised by ``ask`` and ``warm`` after ``Conversation.close()``, and to
    every caller still waiting when it is called. (When the dispatcher
    closes instead, they get ``DispatcherClosed``.)
    """


@final
class TooManyToolRounds(DispatchError):
    """The model asked for tools once more after ``max_tool_rounds`` rounds.

    The turn failed without running that round's tools, and the history is
    as it was before the turn (like any failed turn); the conversation
    stays usable.

    Attributes:
        rounds: The rounds of tools the turn ran (``max_tool_rounds``).
    """

    def __init__(self, message: str, *, rounds: int) -> None:
        super().__init__(message)
        self.rounds = rounds


class ServerLoadUnavailable(DispatchError):
    """A model server's own load could not be read this time.

    Raised by ``ServerMetrics`` when its server gives no answer within its
    ``timeout``, cannot be reached, or answers with another status than
    200, and (as ``UnknownServerMetrics``) when the answer is not a load it
    can read. Nothing is wrong with the caller: a server that is busy
    restarting, or slow to answer, says nothing of its load until it
    answers again, so catch this, keep what was known, and read again
    later. A callable of your own that reads a load may raise it too.

    Attributes:
        url: The metrics address asked, with its credentials masked, or
            ``None`` when no address was involved (``parse_server_load``).
        status_code: The HTTP status of the answer, when there was one
            that was not 200.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code


@final
class UnknownServerMetrics(ServerLoadUnavailable, ValueError):
    """The text is not the metrics of a server whose load can be read.

    It is not Prometheus' text exposition format, or it names none of the
    gauges of vLLM, llama.cpp's server, SGLang or TGI (the message lists
    the names looked for), or names those of more than one, or one of them
    holds what is no count of requests (a negative number, NaN, a
    fraction, another type than a gauge). A ``ServerLoadUnavailable``, so
    that one ``except`` ignores every failed reading, and a ``ValueError``,
    as ``parse_server_load`` is a parser.
    """


class ProviderError(DispatchError):
    """Base class of everything that goes wrong between us and an LLM API.

    Attributes:
        provider: The id of the provider that failed.
        status_code: The HTTP status, when the error came with one.
        retryable: Whether sending the same request again may succeed.
        rate_limits: What the answer's headers said of the account's rate
            limits (``x-ratelimit-*``, ``anthropic-ratelimit-*``,
            ``Retry-After``), or ``None`` when it said nothing or there
            was no answer. A dispatcher the call went through learns from
            it (see ``Provider``).
    """

    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status_code: int | None = None,
        rate_limits: RateLimitInfo | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status_code = status_code
        self.rate_limits = rate_limits


class _Busy(ProviderError):
    """A provider's "not now": it may say how long to wait."""

    retryable: ClassVar[bool] = True

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status_code: int | None = None,
        retry_after: float | None = None,
        rate_limits: RateLimitInfo | None = None,
    ) -> None:
        super().__init__(
            message,
            provider=provider,
            status_code=status_code,
            rate_limits=rate_limits,
        )
        self.retry_after = retry_after


@final
class RateLimited(_Busy):
    """HTTP 429, or a rate-limit error inside the stream.

    Attributes:
        retry_after: Seconds the provider asked us to wait, or ``None``.
    """


@final
class Overloaded(_Busy):
    """HTTP 529 or 503, or an overloaded error inside the stream.

    The provider is busy for everyone, not refusing this account.

    Attributes:
        retry_after: Seconds the provider asked us to wait, or ``None``.
    """


@final
class ServerError(ProviderError):
    """Any other 5xx, or a server-side error inside the stream."""

    retryable: ClassVar[bool] = True


@final
class AuthenticationError(ProviderError):
    """HTTP 401 or 403: the key is wrong, revoked, or not allowed this."""


@final
class BadRequest(ProviderError):
    """Any other 4xx: the request itself is wrong, and will stay wrong."""


@final
class ProviderConnectionError(ProviderError):
    """The connection failed, broke before the response, or went silent.

    A read timeout in the middle of a stream (the server stalled) is one of
    these too.
    """

    retryable: ClassVar[bool] = True


@final
class StreamInterrupted(ProviderError):
    """The stream ended, or the connection dropped, before its terminator.

    OpenAI streams end with ``data: [DONE]`` after a finish reason;
    Anthropic streams end with ``message_stop``. Events already yielded
    stand, but the answer is incomplete.
    """

    retryable: ClassVar[bool] = True


@final
class MalformedStream(ProviderError):
    """An event was not valid JSON, or missed fields its type requires.

    The message names what was wrong and where.
    """

    retryable: ClassVar[bool] = True


@final
class RequestFailed(ProviderError):
    """The request could not be encoded or sent, for a reason on our side.

    The history holds something JSON cannot encode, the HTTP client was
    closed, or it failed in a way it does not document. Sending the same
    request again would fail the same way, so it is not retryable; the turn
    fails, and the dispatcher and its other conversations go on.
    """
