"""Argument checks shared by the public entry points, and the one rule they keep.

The rule:

* a value of the wrong type raises ``TypeError``: anything but an ``int``
  where an integer is expected (a ``float`` such as ``2.0`` included), a
  ``bool`` where any number is expected, a string anywhere;
* a value of the right type outside its range raises ``ValueError``: a
  negative number, zero where a positive one is needed, NaN, an infinity
  where a finite number is needed, an ``int`` too large for a float (it is
  the infinity it would round to);
* both say ``"{name} must be {rule}, got {value!r}"``, as in
  ``"limit must be a positive integer, got 0"`` or
  ``"retry_after must be a non-negative number of seconds, got '1'"``, and
  are raised at once, before anything has changed.

Each check is a plain function, ``check_x(value, name)``, that returns the
value to use (seconds as a ``float``). Classes made with attrs use the same
functions: ``validator`` turns a check into an attrs validator that names
the field after the attribute, and the validators fields use most are
ready below (``positive_int``...). Wrap one in
``attrs.validators.optional`` for a field that may be ``None``. Validators
leave the value as given (an ``int`` stays an ``int``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus, urlsplit

if TYPE_CHECKING:
    from collections.abc import Callable

    import attrs


def check_string(value: object, name: str) -> str:
    """A ``str``, empty or not."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {shown_value(value)}")
    return value


def check_text(value: object, name: str) -> str:
    """A non-empty ``str``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a non-empty string, got {shown_value(value)}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string, got ''")
    return value


def check_provider(provider: object) -> str:
    """A provider name is a non-empty string."""
    return check_text(provider, "provider")


#: The longest tenant name: ``Tenant`` keys, ``tenant=`` arguments, the
#: admin API's ``/tenants/{tenant}``.
MAX_TENANT_NAME = 256


def check_tenant_name(tenant: object, name: str = "tenant") -> str:
    """A tenant's name: a non-empty ``str`` of at most ``MAX_TENANT_NAME`` characters."""
    check_text(tenant, name)
    assert isinstance(tenant, str)  # checked just above
    if len(tenant) > MAX_TENANT_NAME:
        raise ValueError(
            f"{name} must be at most {MAX_TENANT_NAME} characters,"
            f" got one of {len(tenant)}"
        )
    return tenant


def check_optional_tenant(tenant: object, name: str = "tenant") -> str | None:
    """``None`` (no tenant), or a tenant's name."""
    return None if tenant is None else check_tenant_name(tenant, name)


def check_optional_model(model: object, name: str = "model") -> str | None:
    """``None`` (no model named), or a model's name: a non-empty ``str``."""
    return None if model is None else check_text(model, name)


def _integer(
    value: object, name: str, rule: str, low: int, high: int | None = None
) -> int:
    """An ``int`` (not a ``bool``, not a float) from ``low`` to ``high``, described by ``rule``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {rule}, got {shown_value(value)}")
    return value


def check_limit(limit: object, name: str = "limit") -> int:
    """A positive ``int`` (not a ``bool``, not a float): limits and counts >= 1."""
    return _integer(limit, name, "a positive integer", 1)


#: The highest concurrency limit anywhere: ``open_dispatcher``, ``set_limit``,
#: ``AdaptiveLimit`` and the admin API's ``PUT /limits/{provider}``. More
#: concurrent streams than any provider account takes; for no limit at all,
#: ``remove_limit``.
MAX_LIMIT = 100_000


def check_slot_limit(limit: object, name: str = "limit") -> int:
    """A concurrency limit: a positive ``int`` (not a ``bool``) up to ``MAX_LIMIT``."""
    check_limit(limit, name)
    assert isinstance(limit, int)  # checked just above
    if limit > MAX_LIMIT:
        raise ValueError(
            f"{name} must be at most {MAX_LIMIT}, got {shown_value(limit)}"
        )
    return limit


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """One of a few strings, ``choices``."""
    rule = f"{name} must be one of {', '.join(choices)}"
    if not isinstance(value, str):
        raise TypeError(f"{rule}, got {value!r}")
    if value not in choices:
        raise ValueError(f"{rule}, got {value!r}")
    return value


def check_flag(value: object, name: str) -> bool:
    """``True`` or ``False``: a ``bool``, not another value taken for one."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_count(count: object, name: str) -> int:
    """A non-negative ``int`` (not a ``bool``, not a float)."""
    return _integer(count, name, "a non-negative integer", 0)


#: The priorities a request may have: far more classes than anyone needs,
#: and few enough that a class's credit (``priority * priority_aging``) stays
#: a float of useful precision.
MAX_PRIORITY = 1_000_000


def check_priority(priority: object, name: str = "priority") -> int:
    """A priority class: an ``int`` (not a ``bool``) within ``MAX_PRIORITY`` of 0."""
    rule = f"an integer from -{MAX_PRIORITY} to {MAX_PRIORITY}"
    return _integer(priority, name, rule, -MAX_PRIORITY, MAX_PRIORITY)


def check_seed(seed: object, name: str = "seed") -> int | None:
    """A seed is an ``int`` (not a ``bool``) or ``None``; any such value will do."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise TypeError(f"{name} must be an integer or None, got {seed!r}")
    return seed


def check_max_waiting(max_waiting: object) -> int | None:
    """``max_waiting`` is ``None`` or a non-negative ``int``."""
    if max_waiting is None:
        return None
    return check_count(max_waiting, "max_waiting")


def as_float(value: float) -> float:
    """``float(value)``, with an ``int`` beyond any float as an infinity.

    ``float(10**400)`` raises ``OverflowError``; as an infinity, a check for
    a finite number refuses it with the same ``ValueError`` as any other.
    """
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def shown_value(value: object) -> str:
    """``repr(value)``, or a short stand-in for an int too long to print."""
    try:
        return repr(value)
    except ValueError:
        # Beyond sys.get_int_max_str_digits(), an int refuses to print.
        assert isinstance(value, int)
        return f"an integer of {value.bit_length()} bits"


def real_number(value: object, name: str, rule: str) -> float:
    """``value`` as a float if it is an ``int`` or a ``float``; else TypeError.

    The first half of every check of a number: a check of a range of its
    own (a temperature's) calls it, then refuses what is out of its range
    with ``ValueError(f"{name} must be {rule}, got {shown_value(value)}")``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    return as_float(value)


def _non_negative(value: object, name: str, positive: bool, what: str) -> float:
    """A finite real number >= 0 (or > 0), ``what`` it is named in the messages."""
    rule = f"a {'positive' if positive else 'non-negative'} {what}"
    number = real_number(value, name, rule)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ValueError(f"{name} must be {rule}, got {shown_value(value)}")
    return number


def check_number(value: object, name: str, *, positive: bool = False) -> float:
    """A finite real number, >= 0 (or > 0): rates, weights, temperatures."""
    return _non_negative(value, name, positive, "number")


def check_positive_number(value: object, name: str) -> float:
    """A finite real number > 0."""
    return check_number(value, name, positive=True)


def check_fraction(value: object, name: str) -> float:
    """A real number from 0 to 1, both included."""
    rule = "a number from 0 to 1"
    number = real_number(value, name, rule)
    if not 0 <= number <= 1:
        raise ValueError(f"{name} must be {rule}, got {shown_value(value)}")
    return number


def check_seconds(value: object, name: str, *, positive: bool = False) -> float:
    """A duration is a finite real number of seconds, >= 0 (or > 0)."""
    return _non_negative(value, name, positive, "number of seconds")


def check_positive_seconds(value: object, name: str) -> float:
    """A finite real number of seconds > 0."""
    return check_seconds(value, name, positive=True)


def check_optional_seconds(
    value: object, name: str, *, positive: bool = False
) -> float | None:
    """Like ``check_seconds``, with ``None`` allowed."""
    return None if value is None else check_seconds(value, name, positive=positive)


def check_pauses(default_pause: object, max_pause: object) -> tuple[float, float]:
    """``0 <= default_pause <= max_pause``, and ``max_pause > 0``, in seconds."""
    first = check_seconds(default_pause, "default_pause")
    ceiling = check_seconds(max_pause, "max_pause", positive=True)
    if first > ceiling:
        raise ValueError(
            f"default_pause must be at most max_pause={max_pause!r},"
            f" got {default_pause!r}"
        )
    return first, ceiling


def check_instant(value: object, name: str) -> float:
    """An instant on the trio clock is a finite real number."""
    instant = real_number(value, name, "a finite number")
    if not math.isfinite(instant):
        raise ValueError(f"{name} must be a finite number, got {shown_value(value)}")
    return instant


def check_deadline(value: object, name: str) -> float:
    """An instant on the trio clock or an infinity (never): any number but NaN."""
    deadline = real_number(value, name, "a number")
    if math.isnan(deadline):
        raise ValueError(f"{name} must be a number, got {shown_value(value)}")
    return deadline


# -- the same checks for attrs classes ------------------------------------------


def validator(
    check: Callable[[Any, str], object],
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """An attrs validator that runs ``check(value, attribute.name)``."""

    def validate(
        _instance: object, attribute: attrs.Attribute[Any], value: object
    ) -> None:
        check(value, attribute.name)

    return validate


positive_int = validator(check_limit)
"""An attrs validator: a positive ``int``, not a ``bool``."""

slot_limit = validator(check_slot_limit)
"""An attrs validator: a concurrency limit, from 1 to ``MAX_LIMIT``."""

non_negative_int = validator(check_count)
"""An attrs validator: a non-negative ``int``, not a ``bool``."""

non_negative_seconds = validator(check_seconds)
"""An attrs validator: a finite, non-negative number of seconds."""

positive_seconds = validator(check_positive_seconds)
"""An attrs validator: a finite, positive number of seconds."""

non_negative_number = validator(check_number)
"""An attrs validator: a finite, non-negative real number."""

positive_number = validator(check_positive_number)
"""An attrs validator: a finite, positive real number."""

flag = validator(check_flag)
"""An attrs validator: ``True`` or ``False``."""

string = validator(check_string)
"""An attrs validator: a ``str``, empty or not."""

text = validator(check_text)
"""An attrs validator: a non-empty ``str``."""


def one_of(*choices: str) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """An attrs validator: one of ``choices``, a few strings."""
    return validator(lambda value, name: check_choice(value, name, choices))


_REDIS_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: object, name: str = "redis_url") -> str | None:
    """``None``, or a ``redis://``, ``rediss://`` or ``unix://`` URL."""
    if url is None:
        return None
    rule = f"{name} must be a redis://, rediss:// or unix:// URL"
    if not isinstance(url, str):
        raise TypeError(f"{rule}, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # parsing the port is the check
    except ValueError:
        raise ValueError(f"{rule}, got {redact_url(url)!r}") from None
    if parts.scheme not in _REDIS_SCHEMES or (
        not parts.hostname if parts.scheme != "unix" else not parts.path
    ):
        raise ValueError(f"{rule}, got {redact_url(url)!r}")
    return url


# Query parameters whose names contain one of these (compared in lower
# case) carry a credential: password, username, token, secret, api key...
_CREDENTIAL_WORDS = ("pass", "pwd", "user", "token", "secret", "key", "auth", "cred")
_MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with every credential masked, for errors, logs and reprs.

    The whole userinfo (``user:password@``) becomes ``***@``, and so does
    the value of every query parameter whose name speaks of a credential
    (``password``, ``username``, ``token``, ``secret``, ``api_key``,
    ``auth``...: coredis takes ``password`` and ``username`` there). A URL
    that cannot be parsed is not shown if it might hold one.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or ("@" in url and "@" not in parts.netloc):
        # Unparsable, or an '@' outside the userinfo (a password with a
        # '/', '?' or '#' not percent-encoded): shown, it could leak.
        return "<a URL with credentials>" if "@" in url or "?" in url else url
    redacted = url
    if "@" in parts.netloc:
        start = url.index(parts.netloc)
        host = parts.netloc.rpartition("@")[2]
        redacted = f"{url[:start]}{_MASK}@{host}{url[start + len(parts.netloc) :]}"
    query = "&".join(_redact_parameter(part) for part in parts.query.split("&"))
    if query != parts.query:
        # The original text around it, as given (geturl() would normalise).
        base, _, tail = redacted.partition("?")
        _, hash_, fragment = tail.partition("#")
        redacted = f"{base}?{query}{hash_}{fragment}"
    return redacted


def _redact_parameter(parameter: str) -> str:
    """``name=value`` with the value masked if the name speaks of a credential."""
    name, equals, _value = parameter.partition("=")
    lowered = unquote_plus(name).lower()
    if equals and any(word in lowered for word in _CREDENTIAL_WORDS):
        return f"{name}={_MASK}"
    return parameter


def check_namespace(namespace: object, name: str = "namespace") -> str:
    """A non-empty string without ``:``, braces or glob characters.

    ``:`` separates a key's parts; the pub/sub pattern of a namespace's
    wake-ups is built from it, and a glob character would silently match
    nothing.
    """
    namespace = check_text(namespace, name)
    if any(char in namespace for char in ":{}*?[]\\"):
        raise ValueError(
            f"{name} must not contain ':', '{{', '}}', '*', '?', '[', ']' or"
            f" '\\', got {namespace!r}"
        )
    return namespace
