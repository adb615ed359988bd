"""The admin API as a plain ASGI 3 application.

Every request goes through the same checks, in this order, and the
dispatcher is touched only after the last one passed, so a refused request
changes nothing:

1. ``/healthz`` answers anyone, before any other check;
2. the token (``Authorization: Bearer <token>``, compared in constant time),
   before anything else about the request is looked at: 401 with
   ``WWW-Authenticate: Bearer``;
3. the path: a route that does not exist is 404, a method the route does
   not have 405 with ``Allow``, a provider or tenant name that is not valid
   percent-encoded UTF-8 400, one longer than ``MAX_PROVIDER_LENGTH`` (a
   tenant's: 256 characters) 422;
4. the body, for ``PUT`` only: longer than ``MAX_BODY_BYTES`` 413, not
   JSON 400, not exactly ``{"limit": n}`` with ``1 <= n <= MAX_LIMIT`` 422
   (for a tenant, not ``{"weight": w, "limit": n}``, both optional, as
   ``Tenant`` takes them: 422 with ``Tenant``'s own message). A number is
   an integer when it has no fractional part (``8.0`` is 8), as the
   OpenAPI document's schemas count it; they state each of these bounds.

Errors are RFC 9457 problem details (``application/problem+json``). The
app calls only the dispatcher's public methods, each synchronous, from the
task hypercorn runs the request in; so it must be served in the trio run
that holds the dispatcher, which it checks.
"""

from __future__ import annotations

import hmac
import importlib
import json
import logging
import re
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import trio

from .._dispatch._dispatcher import Dispatcher
from .._exceptions import DispatcherClosed
from .._json import json_kind
from .._observe._asgi import lifespan
from .._util import NoPublicConstructor
from .._validation import check_tenant_name
from ..messages._limits import Tenant
from ._caps import (
    MAX_BODY_BYTES,
    MAX_LIMIT,
    MAX_PROVIDER_LENGTH,
    MAX_WEIGHT,
    MIN_TOKEN_LENGTH,
    MIN_WEIGHT,
)
from ._openapi import openapi_document
from ._routes import ROUTES, TENANT, match

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Mapping

    from .._dispatch._backend import ProviderStatistics
    from .._observe._asgi import Receive, Send
    from .._policy._tenants import TenantStatistics

    Headers = Iterable[tuple[bytes, bytes]]
    _Handler = Callable[["_Request"], Awaitable[tuple[int, object]]]

_logger = logging.getLogger("trio_dispatch.admin")

_TOKEN: Final = re.compile(r"[\x21-\x7e]+")
_ESCAPE: Final = re.compile(rb"%[0-9A-Fa-f]{2}")
_REALM: Final = b'Bearer realm="trio-dispatch"'
_BAD_TOKEN: Final = _REALM + b', error="invalid_token"'


class _Refused(Exception):
    """Raised while handling a request to answer with a problem."""

    def __init__(
        self, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


class _Disconnected(Exception):
    """The client left before its request was read whole."""


@attrs.frozen
class _Request:
    """What a handler gets of a request that passed every check of its route."""

    named: str  # the provider a {provider} route names, the tenant a {tenant}
    scope: Mapping[str, Any]
    receive: Receive


@final
class AdminApp(metaclass=NoPublicConstructor):
    """The admin API of one dispatcher, as an ASGI 3 application.

    Made by ``admin_app``. Serve it in the trio run that holds the
    dispatcher; its repr shows no token.
    """

    __slots__ = ("_dispatcher", "_document", "_handlers", "_registry", "_run", "_token")

    def __init__(self, dispatcher: Dispatcher, token: bytes) -> None:
        self._dispatcher = dispatcher
        self._token = token
        self._run = trio.lowlevel.current_trio_token()
        self._document = json.dumps(openapi_document()).encode()
        # The Prometheus registry, made at the first scrape.
        self._registry: Any = None
        # Each route of the table answered by the method it names.
        self._handlers: dict[str, _Handler] = {
            route.handler: getattr(self, f"_{route.handler}") for route in ROUTES
        }

    def __repr__(self) -> str:
        return f"<AdminApp of {self._dispatcher!r}>"

    async def __call__(
        self, scope: Mapping[str, Any], receive: Receive, send: Send
    ) -> None:
        """The ASGI 3 entry point."""
        try:
            run = trio.lowlevel.current_trio_token()
        except RuntimeError:
            run = None
        if run is not self._run:
            raise RuntimeError(
                "the admin app must be served in the trio run of its dispatcher,"
                " for instance with hypercorn.trio.serve in the same nursery"
            )
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})

    async def _http(
        self, scope: Mapping[str, Any], receive: Receive, send: Send
    ) -> None:
        method: str = scope["method"]
        path = _raw_path(scope)
        routes, raw = match(path)
        try:
            # A path is open (``/healthz``) when every route on it is; an
            # unknown path needs the token before it is told it is unknown.
            if not routes or any(route.auth for route in routes):
                self._authenticate(scope, method, path)
            if not routes:
                raise _Refused(404, "no such route; GET /openapi.json lists them")
            chosen = [route for route in routes if route.method == method]
            if not chosen:
                allowed = ", ".join(route.method for route in routes)
                raise _Refused(
                    405,
                    f"{method} is not allowed here; allowed: {allowed}",
                    ((b"allow", allowed.encode()),),
                )
            tenant = chosen[0].parameter == TENANT
            named = "" if raw is None else _argument(raw, tenant)
            request = _Request(named, scope, receive)
            status, payload = await self._handlers[chosen[0].handler](request)
        except _Refused as refused:
            await _send_problem(send, refused)
        except _Disconnected:
            return
        else:
            if isinstance(payload, tuple):
                body, content_type = payload
                await _send(send, status, body, content_type)
            else:
                await _send_json(send, status, payload)

    def _authenticate(self, scope: Mapping[str, Any], method: str, path: bytes) -> None:
        """Raise ``_Refused`` (401) unless the request carries the token."""
        presented = [
            value
            for name, value in scope["headers"]
            if name.lower() == b"authorization"
        ]
        if not presented:
            _refused_log(scope, method, path, "no token")
            raise _Refused(
                401,
                "this route needs Authorization: Bearer <token>",
                ((b"www-authenticate", _REALM),),
            )
        scheme, _, credentials = presented[0].strip().partition(b" ")
        # Every request pays for one comparison of the whole token, whatever
        # else is wrong with its header, so timing says nothing about it.
        matches = hmac.compare_digest(credentials.strip(b" \t"), self._token)
        if not matches or len(presented) != 1 or scheme.lower() != b"bearer":
            _refused_log(scope, method, path, "a wrong token")
            raise _Refused(
                401, "the token is not valid", ((b"www-authenticate", _BAD_TOKEN),)
            )

    # -- the handlers the route table names ----------------------------------------

    async def _get_health(self, request: _Request) -> tuple[int, object]:
        if self._dispatcher.closed:
            return 503, {"status": "closed"}
        return 200, {"status": "ok"}

    async def _get_open_api(self, request: _Request) -> tuple[int, object]:
        return 200, (self._document, b"application/json")

    async def _get_limits(self, request: _Request) -> tuple[int, object]:
        return 200, {"limits": self._dispatcher.limits()}

    async def _get_status(self, request: _Request) -> tuple[int, object]:
        return 200, _status(self._dispatcher)

    async def _get_metrics(self, request: _Request) -> tuple[int, object]:
        return self._metrics(request.scope)

    async def _resume(self, request: _Request) -> tuple[int, object]:
        dispatcher, provider = self._dispatcher, request.named
        if provider not in dispatcher.statistics().providers:
            raise _Refused(404, f"no provider named {provider!r} is limited or used")
        _closed_is_503(dispatcher.resume, provider)
        _logger.info("admin API: resumed %r", provider)
        stats = dispatcher.statistics().providers[provider]
        return 200, _provider_status(stats, trio.current_time())

    async def _remove_limit(self, request: _Request) -> tuple[int, object]:
        provider = request.named
        _closed_is_503(self._dispatcher.remove_limit, provider)
        _logger.info("admin API: removed the limit of %r", provider)
        return 200, {"provider": provider, "limit": None}

    async def _set_limit(self, request: _Request) -> tuple[int, object]:
        provider = request.named
        limit = _limit_in(await _read_body(request.scope, request.receive))
        _closed_is_503(self._dispatcher.set_limit, provider, limit)
        _logger.info("admin API: set the limit of %r to %d", provider, limit)
        return 200, {"provider": provider, "limit": limit}

    async def _get_tenants(self, request: _Request) -> tuple[int, object]:
        dispatcher = self._dispatcher
        return 200, {
            "tenants": {
                name: _tenant_settings(name, settings)
                for name, settings in sorted(dispatcher.tenants().items())
            },
            "providers": {
                provider: {
                    name: _tenant_status(tenant)
                    for name, tenant in sorted(stats.tenants.items())
                }
                for provider, stats in dispatcher.statistics().providers.items()
            },
        }

    async def _set_tenant(self, request: _Request) -> tuple[int, object]:
        tenant = request.named
        settings = _tenant_in(await _read_body(request.scope, request.receive))
        _closed_is_503(self._dispatcher.set_tenant, tenant, settings)
        _logger.info(
            "admin API: set tenant %r to weight %s, limit %s",
            tenant,
            settings.weight,
            "none" if settings.limit is None else settings.limit,
        )
        return 200, _tenant_settings(tenant, settings)

    async def _remove_tenant(self, request: _Request) -> tuple[int, object]:
        tenant = request.named
        _closed_is_503(self._dispatcher.remove_tenant, tenant)
        _logger.info("admin API: put tenant %r back to the defaults", tenant)
        return 200, _tenant_settings(tenant, Tenant())

    def _metrics(self, scope: Mapping[str, Any]) -> tuple[int, object]:
        """The Prometheus exposition, in the format the scraper asks for."""
        if self._registry is None:
            # Imported at the first scrape: both are optional. Without them
            # there are no metrics to find (404): not a server error.
            try:
                exposition = importlib.import_module("prometheus_client.exposition")
                registry_module = importlib.import_module("prometheus_client.registry")
            except ImportError:
                raise _Refused(
                    404, "metrics need the prometheus_client package"
                ) from None
            try:
                metrics = importlib.import_module("trio_dispatch.metrics")
            except ImportError:
                raise _Refused(
                    404, "this trio-dispatch has no Prometheus collector"
                ) from None
            registry = registry_module.CollectorRegistry(auto_describe=True)
            registry.register(metrics.PrometheusCollector(self._dispatcher))
            self._registry = (registry, exposition)
        registry, exposition = self._registry
        accept = _header(scope, b"accept").decode("latin-1")
        encode, content_type = exposition.choose_encoder(accept)
        return 200, (encode(registry), content_type.encode())


def admin_app(dispatcher: Dispatcher, *, token: str) -> AdminApp:
    """The admin API of ``dispatcher``, as an ASGI 3 application.

    Serve it in the trio run that holds the dispatcher, with hypercorn on
    trio, as one more task of the application's nursery::

        from hypercorn.config import Config
        from hypercorn.trio import serve

        config = Config()
        config.bind = ["127.0.0.1:8081"]
        app = admin_app(dispatcher, token=os.environ["ADMIN_TOKEN"])
        await nursery.start(partial(serve, app, config, shutdown_trigger=stop.wait))

    The server stops when ``stop`` is set (or the nursery is cancelled).

    Every route but ``GET /healthz`` needs ``Authorization: Bearer <token>``;
    ``GET /openapi.json`` describes them. The token is never logged, shown
    in a repr or sent back.

    Args:
        dispatcher: The dispatcher to show and steer (from
            ``open_dispatcher``).
        token: The bearer token every request must present: at least
            ``MIN_TOKEN_LENGTH`` characters, each visible ASCII (no spaces),
            such as ``secrets.token_urlsafe(32)``.

    Raises:
        TypeError: ``dispatcher`` is not a ``Dispatcher``, or ``token`` not
            a ``str``.
        ValueError: ``token`` is too short or has other characters.
        RuntimeError: Not called inside a trio run.
    """
    if not isinstance(dispatcher, Dispatcher):
        raise TypeError(
            f"dispatcher must be a Dispatcher, got {type(dispatcher).__name__}"
        )
    # The messages below never show the token, only what is wrong with it.
    if not isinstance(token, str):
        raise TypeError(f"token must be a string, got {type(token).__name__}")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"token must be at least {MIN_TOKEN_LENGTH} characters, got {len(token)}"
        )
    if _TOKEN.fullmatch(token) is None:
        raise ValueError(
            "token must be visible ASCII characters only (no spaces),"
            " such as secrets.token_urlsafe(32) gives"
        )
    return AdminApp._create(dispatcher, token.encode("ascii"))


# -- requests ---------------------------------------------------------------------


def _raw_path(scope: Mapping[str, Any]) -> bytes:
    """The path as sent, percent-escapes kept, without the app's root path.

    The decoded ``path`` cannot tell ``a%2Fb`` (one provider named ``a/b``)
    from ``a/b`` (two segments), nor say whether its escapes were valid.
    """
    raw = scope.get("raw_path")
    path = scope["path"].encode("utf-8") if raw is None else bytes(raw)
    root = scope.get("root_path", "").encode("utf-8")
    if root and path.startswith(root + b"/"):
        path = path[len(root) :]
    return path


def _argument(raw: bytes, tenant: bool) -> str:
    """A provider's or a tenant's name from its path segment: percent-encoded UTF-8."""
    kind = "tenant" if tenant else "provider"
    if raw.count(b"%") != len(_ESCAPE.findall(raw)):
        raise _Refused(400, f"the {kind} name has a bad percent-escape")
    try:
        name = _unquote(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise _Refused(400, f"the {kind} name is not UTF-8") from None
    if tenant:
        try:
            return check_tenant_name(name)
        except ValueError as exc:
            raise _Refused(422, str(exc)) from None
    if len(name) > MAX_PROVIDER_LENGTH:
        raise _Refused(
            422,
            f"provider must be at most {MAX_PROVIDER_LENGTH} characters,"
            f" got {len(name)}",
        )
    return name


def _unquote(raw: bytes) -> bytes:
    return _ESCAPE.sub(lambda escape: bytes([int(escape[0][1:], 16)]), raw)


def _header(scope: Mapping[str, Any], wanted: bytes) -> bytes:
    """The first value of a header, or ``b""``."""
    for name, value in scope["headers"]:
        if name.lower() == wanted:
            return bytes(value)
    return b""


async def _read_body(scope: Mapping[str, Any], receive: Receive) -> bytes:
    """The request body, refused (413) beyond ``MAX_BODY_BYTES``."""
    too_large = _Refused(413, f"the body must be at most {MAX_BODY_BYTES} bytes")
    length = _header(scope, b"content-length")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _json_in(body: bytes) -> object:
    """The JSON document of a body; 400 if it is not one."""
    try:
        return json.loads(
            body.decode("utf-8"),
            parse_constant=_no_constant,
            object_pairs_hook=_unique_keys,
        )
    except UnicodeDecodeError:
        raise _Refused(400, "the body is not UTF-8") from None
    except RecursionError:
        raise _Refused(400, "the body is nested too deeply") from None
    except ValueError as exc:
        raise _Refused(400, f"the body is not JSON: {exc}") from None


def _object_in(body: bytes, fields: set[str], rule: str) -> dict[str, Any]:
    """The body's JSON object, of no field but ``fields``, else 400 or 422 by ``rule``."""
    document = _json_in(body)
    if not isinstance(document, dict):
        raise _Refused(422, f"the body must be {rule}, got {json_kind(document)}")
    unknown = sorted(set(document) - fields)
    if unknown:
        raise _Refused(422, f"unknown field {_shown(unknown[0])}; the body is {rule}")
    return document


def _limit_in(body: bytes) -> int:
    """The limit of a ``{"limit": n}`` body, checked whole; else 400 or 422."""
    rule = f"a JSON object {{'limit': n}}, n an integer from 1 to {MAX_LIMIT}"
    document = _object_in(body, {"limit"}, rule)
    if "limit" not in document:
        raise _Refused(422, f"limit is required; the body is {rule}")
    limit = _json_integer(document["limit"])
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise _Refused(422, f"limit must be a positive integer, got {_shown(limit)}")
    if limit > MAX_LIMIT:
        raise _Refused(
            422,
            f"limit must be at most {MAX_LIMIT}, got {_shown(limit)};"
            " DELETE the limit to lift it",
        )
    return limit


def _tenant_in(body: bytes) -> Tenant:
    """The settings of a ``{"weight": w, "limit": n}`` body; else 400 or 422.

    Both fields are optional (``Tenant``'s defaults); ``Tenant`` checks
    them, and its message is the answer's detail.
    """
    rule = (
        "a JSON object {'weight': w, 'limit': n}, both optional,"
        f" w a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g},"
        f" n an integer from 1 to {MAX_LIMIT} or null"
    )
    document = _object_in(body, {"weight", "limit"}, rule)
    if "limit" in document:
        document["limit"] = _json_integer(document["limit"])
    try:
        return Tenant(**document)
    except (TypeError, ValueError) as exc:
        raise _Refused(422, str(exc)) from None


def _json_integer(value: object) -> object:
    """A JSON number with no fractional part as the ``int`` it is; else ``value``.

    JSON has one kind of number: ``8.0`` and ``8e0`` are the integer 8, for
    the OpenAPI document's ``"type": "integer"`` as for any JSON reader.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _tenant_status(stats: TenantStatistics) -> dict[str, object]:
    """One tenant's statistics as plain JSON types.

    Its service is finite: ``MIN_WEIGHT`` bounds the weight it divides by.
    """
    return attrs.asdict(stats)


def _tenant_settings(tenant: str, settings: Tenant) -> dict[str, object]:
    """A tenant's settings as plain JSON types."""
    return {"tenant": tenant, "weight": settings.weight, "limit": settings.limit}


def _no_constant(name: str) -> object:
    raise _Refused(400, f"the body is not JSON: {name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _Refused(400, "the body repeats a key")
    return document


def _shown(value: object) -> str:
    """``value`` as JSON, cut short, for a message.

    Every number in a body fits ``MAX_BODY_BYTES``, far below the digits
    Python refuses to print.
    """
    shown = json.dumps(value)
    return shown if len(shown) <= 40 else f"{shown[:37]}..."


def _closed_is_503(action: Callable[..., None], *args: object) -> None:
    try:
        action(*args)
    except DispatcherClosed:
        raise _Refused(503, "the dispatcher is closed") from None


def _refused_log(scope: Mapping[str, Any], method: str, path: bytes, why: str) -> None:
    # The path is the client's, so it is shown quoted and cut short; the
    # token never is.
    _logger.info(
        "admin API: refused %s %r from %s: %s", method, path[:80], _client(scope), why
    )


def _client(scope: Mapping[str, Any]) -> str:
    client = scope.get("client")
    if not client:
        return "an unknown client"
    host, port = client
    return f"{host}:{port}"


# -- answers ----------------------------------------------------------------------


def _status(dispatcher: Dispatcher) -> dict[str, object]:
    """The dispatcher's statistics as plain JSON types."""
    statistics = dispatcher.statistics()
    now = trio.current_time()
    return {
        "closed": statistics.closed,
        "providers": {
            name: _provider_status(stats, now)
            for name, stats in statistics.providers.items()
        },
        "pools": {
            name: attrs.asdict(stats) for name, stats in statistics.pools.items()
        },
    }


def _provider_status(stats: ProviderStatistics, now: float) -> dict[str, object]:
    """One provider's statistics; the ends of a pause and a cooldown as seconds from ``now``.

    A trio-clock instant means nothing outside the process, so the end of a
    pause, or of a member's time out of service, is shown as the seconds
    left until it (0.0 when it is due).
    """
    status = attrs.asdict(stats)
    for name in _INSTANTS:
        until = status[name]
        status[name] = None if until is None else max(0.0, float(until - now))
    # Renamed where they stand, so the keys keep the schema's order.
    return {_INSTANTS.get(name, name): value for name, value in status.items()}


# A provider's instants, shown as the seconds left: by their names in the status.
_INSTANTS: Final = {
    "paused_until": "pause_remaining",
    "out_of_service_until": "out_of_service_remaining",
}


async def _send(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send: Send, status: int, payload: object) -> None:
    body = json.dumps(payload, allow_nan=False).encode()
    await _send(send, status, body, b"application/json")


async def _send_problem(send: Send, refused: _Refused) -> None:
    problem = {
        "type": "about:blank",
        "title": HTTPStatus(refused.status).phrase,
        "status": refused.status,
        "detail": refused.detail,
    }
    body = json.dumps(problem).encode()
    await _send(
        send, refused.status, body, b"application/problem+json", refused.headers
    )
