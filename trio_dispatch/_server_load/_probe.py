"""Where a server's load comes from: its metrics endpoint, or a callable of yours.

A source of load is either a ``ServerMetrics`` (the address of a server's
``/metrics``, read over HTTP with the client it is given) or any async
callable taking no argument and returning a ``ServerLoad``, for a server
whose metrics are not among those ``parse_server_load`` recognises, or
that tells its load some other way. ``read_server_load`` reads either, the
one way the dispatcher will, and never for longer than a timeout: what
fails to read (no answer in time, not 200, text it cannot read) raises
``ServerLoadUnavailable``, which the reader catches and ignores.

Nothing here imports httpx2 until a load is read: the client comes from
the caller.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, NoReturn, TypeAlias, final
from urllib.parse import urlsplit

import attrs
import trio

from .._exceptions import ServerLoadUnavailable, UnknownServerMetrics
from .._util import is_async_callable
from .._validation import (
    check_positive_seconds,
    positive_seconds,
    redact_url,
    shown_value,
    validator,
)
from ._formats import parse_server_load
from ._load import ServerLoad

if TYPE_CHECKING:
    import httpx2

DEFAULT_TIMEOUT: Final = 1.0
"""Seconds a reading of a server's load may take, by default."""

# Asked for by name: a prometheus_client endpoint answers OpenMetrics to a
# client that prefers it, and the parser reads the classic text format.
_ACCEPT: Final = {"accept": "text/plain; version=0.0.4"}


def check_metrics_url(value: object, name: str = "url") -> str:
    """An ``http://`` or ``https://`` URL with a host, shown redacted when refused."""
    rule = f"{name} must be an http:// or https:// URL with a host"
    if not isinstance(value, str):
        raise TypeError(f"{rule}, got {shown_value(value)}")
    shown = redact_url(value)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  # parsing the port is the check
    except ValueError:
        raise ValueError(f"{rule}, got {shown!r}") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(char <= " " or char == "\x7f" for char in value)
    ):
        raise ValueError(f"{rule}, got {shown!r}")
    return value


@final
@attrs.frozen
class ServerMetrics:
    """A model server's metrics endpoint, as the source of its own load.

    vLLM, llama.cpp's ``llama-server`` (started with ``--metrics``), SGLang
    (with ``--enable-metrics``) and TGI answer ``GET /metrics`` with their
    running and waiting requests among their other metrics; which server
    it is, is recognised from the names (see ``parse_server_load``).

    ``read(client)`` asks once and gives up after ``timeout`` seconds. A
    reading that fails raises ``ServerLoadUnavailable``: no answer in time,
    no connection, a status other than 200, or (``UnknownServerMetrics``)
    an answer that is not a load it can read. Catch that one and read
    again later; nothing else is raised for what the server does.

    Example::

        ServerMetrics("http://127.0.0.1:8000/metrics")  # vLLM's default port

    Attributes:
        url: The address of the metrics themselves, ``http://`` or
            ``https://`` (a redirect is not followed: it is an answer
            other than 200). Credentials in it (``user:password@``, a
            ``?token=``) are sent, and masked in the repr and in every
            message.
        timeout: Seconds a reading may take, connection and answer
            together (a positive number; 1 by default).
    """

    url: str = attrs.field(
        validator=validator(check_metrics_url),
        repr=lambda url: repr(redact_url(url)),
    )
    timeout: float = attrs.field(
        default=DEFAULT_TIMEOUT, kw_only=True, validator=positive_seconds
    )

    async def read(self, client: httpx2.AsyncClient) -> ServerLoad:
        """Ask the server for its metrics once, with ``client``, and read its load.

        Raises:
            ServerLoadUnavailable: No answer within ``timeout``, no
                connection, or a status other than 200.
            UnknownServerMetrics: The answer is not a load it can read.
            TypeError: ``client`` is not an ``httpx2.AsyncClient``.
        """
        import httpx2  # noqa: PLC0415 (the caller's client has loaded it)

        from ..providers._errors import client_type_error  # noqa: PLC0415 (loads httpx2)

        if not isinstance(client, httpx2.AsyncClient):
            raise client_type_error(client)
        shown = redact_url(self.url)
        response: httpx2.Response | None = None
        failure: str | None = None
        with trio.move_on_after(self.timeout):
            try:
                response = await client.get(self.url, headers=_ACCEPT)
            except httpx2.HTTPError as exc:
                # Only the kind of failure: httpx2's message may quote the URL.
                failure = type(exc).__name__
        # Raised out of the except clause: httpx2's exception holds the
        # request, credentials and all, and would ride along as __context__.
        if failure is not None:
            raise ServerLoadUnavailable(
                f"cannot read the load of {shown}: {failure}", url=shown
            )
        if response is None:
            raise ServerLoadUnavailable(
                f"{shown} gave no answer within {self.timeout:g} seconds", url=shown
            )
        if response.status_code != 200:
            raise ServerLoadUnavailable(
                f"{shown} answered {response.status_code}, not 200",
                url=shown,
                status_code=response.status_code,
            )
        try:
            return parse_server_load(response.text)
        except UnknownServerMetrics as exc:
            raise UnknownServerMetrics(
                f"the answer of {shown} is not a load: {exc}", url=shown
            ) from None


ServerLoadSource: TypeAlias = ServerMetrics | Callable[[], Awaitable[ServerLoad]]
"""Where a server's load comes from: its metrics, or an async callable of yours."""


def check_server_load_source(source: object, name: str = "source") -> ServerLoadSource:
    """A ``ServerMetrics``, or an async callable (taking no argument)."""
    if isinstance(source, ServerMetrics) or is_async_callable(source):
        return source  # type: ignore[return-value]  # the check above is the type
    # An address given bare is shown as ServerMetrics would show it.
    shown = repr(redact_url(source)) if isinstance(source, str) else shown_value(source)
    raise TypeError(
        f"{name} must be a ServerMetrics or an async callable returning a"
        f" ServerLoad, got {shown}"
    )


async def read_server_load(
    source: ServerLoadSource,
    client: httpx2.AsyncClient,
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109  # a late load is an unavailable one, not a cancellation, as ServerMetrics' own timeout
) -> ServerLoad:
    """Read a server's load from ``source``, however it comes, within a timeout.

    A ``ServerMetrics`` is read with ``client`` and within its own
    ``timeout``; a callable is awaited for at most ``timeout`` seconds.

    Raises:
        ServerLoadUnavailable: The reading failed (the callable may raise
            it too), or the callable gave no load within ``timeout``.
        TypeError: The callable returned something else than a
            ``ServerLoad``. Whatever else a callable raises is its own,
            and goes through.
    """
    if isinstance(source, ServerMetrics):
        return await source.read(client)
    check_positive_seconds(timeout, "timeout")
    done = False
    with trio.move_on_after(timeout):
        load = await source()
        done = True
    name = getattr(source, "__name__", type(source).__name__)
    if not done:
        raise ServerLoadUnavailable(f"{name} gave no load within {timeout:g} seconds")
    if not isinstance(load, ServerLoad):
        raise TypeError(f"{name} must return a ServerLoad, got {shown_value(load)}")
    return load


_logger = logging.getLogger("trio_dispatch")


async def poll_server_load(
    provider: str,
    source: ServerLoadSource,
    tell: Callable[[ServerLoad | None], None],
    *,
    every: float,
) -> NoReturn:
    """Read ``provider``'s server load from ``source`` every ``every`` seconds, for ever.

    Each reading is told (``tell(load)``), and so is each failed one, as
    ``None``: a server that stops answering (``ServerLoadUnavailable``), or
    a callable of one's own that raises, is ignored, never fatal; the first
    failure of a run of them is logged as a warning, the recovery as info.
    A ``ServerMetrics`` is read with an ``httpx2.AsyncClient`` of its own,
    kept open between readings.
    """
    failing = False
    async with contextlib.AsyncExitStack() as stack:
        client = None
        if isinstance(source, ServerMetrics):
            import httpx2  # noqa: PLC0415  # only for a server's metrics

            client = await stack.enter_async_context(httpx2.AsyncClient())
        while True:
            try:
                load: ServerLoad | None = await read_server_load(source, client)  # type: ignore[arg-type]  # a callable needs no client
            except Exception as exc:  # a reading that fails is ignored (see above)
                if not failing:
                    _logger.warning(
                        "the server load of %r could not be read, and is ignored"
                        " until it can: %s",
                        provider,
                        exc,
                    )
                failing = True
                load = None
            else:
                if failing:
                    _logger.info("the server load of %r is read again", provider)
                failing = False
            tell(load)
            await trio.sleep(every)
