"""A provider's two rate-limit callbacks, checked once and called one way.

The HTTP providers and ``ScriptedProvider`` each hold one
``RateLimitHooks``: what they are told, and when, is the same for both.
Each answer calls the hooks it was made with (its ``rate_limit_hooks``):
an answer a dispatcher meters (``Meter.metered``) calls none, as the
meter tells the dispatcher what the answer says. It lives outside
``providers`` so that a scripted provider loads no HTTP library.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, final

from .._exceptions import Overloaded, RateLimited

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._exceptions import ProviderError
    from .._policy._ratelimits import RateLimitInfo
    from .._provider import RateLimitObserver, RateLimitReporter

_logger = logging.getLogger("trio_dispatch")


def takes_model(observer: Callable[..., object]) -> bool:
    """Whether an ``on_rate_limits`` observer takes a ``model`` keyword.

    ``Dispatcher.observe_rate_limits`` does: it is told the model the
    answer is for. An observer of two arguments is told the id and the
    figures, as always. Asked once, when the provider is made.
    """
    try:
        parameters = inspect.signature(observer).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature cannot be read
        return False
    return any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD
        or (
            parameter.name == "model"
            and parameter.kind
            in {inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD}
        )
        for parameter in parameters
    )


@final
class RateLimitHooks:
    """``on_rate_limit`` and ``on_rate_limits`` of the provider ``id``.

    Args:
        id: The provider's id, the first argument of either callback.
        on_rate_limit: Told ``(id, retry_after)`` by ``report``.
        on_rate_limits: Told ``(id, figures)`` by ``observe``; also
            ``model=`` if it takes one and ``model`` is given.
        model: The model the provider asks for, if it has one.

    Raises:
        TypeError: A callback given is not callable.
    """

    __slots__ = ("_id", "_model", "_observer", "_reporter")

    def __init__(
        self,
        id: str,
        on_rate_limit: RateLimitReporter | None,
        on_rate_limits: RateLimitObserver | None,
        *,
        model: str | None = None,
    ) -> None:
        if on_rate_limit is not None and not callable(on_rate_limit):
            raise TypeError("on_rate_limit must be callable")
        if on_rate_limits is not None and not callable(on_rate_limits):
            raise TypeError("on_rate_limits must be callable")
        self._id = id
        self._reporter = on_rate_limit
        self._observer = on_rate_limits
        # Asked once, now: is the observer told the model too?
        takes = on_rate_limits is not None and takes_model(on_rate_limits)
        self._model = model if takes else None

    def observe(self, info: RateLimitInfo) -> None:
        """Tell ``on_rate_limits`` an answer's figures; its failure is logged.

        The answer is still the caller's, whatever the observer does.
        """
        observer = self._observer
        if observer is None:
            return
        try:
            if self._model is None:
                observer(self._id, info)
            else:
                observer(self._id, info, model=self._model)  # type: ignore[call-arg]  # checked: it takes a model
        except Exception:
            _logger.exception("%s: the on_rate_limits observer failed", self._id)

    def report(self, error: ProviderError) -> None:
        """Tell ``on_rate_limit`` of a ``RateLimited`` or ``Overloaded`` error."""
        if isinstance(error, RateLimited | Overloaded) and self._reporter:
            self._reporter(self._id, error.retry_after)
