"""Helpers for the package's public face, as trio's ``_util`` has them."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import warnings
from typing import TYPE_CHECKING, Any, Final, Generic, NoReturn, TypeVar, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping
    from contextlib import AbstractAsyncContextManager
    from types import TracebackType

T = TypeVar("T")
K = TypeVar("K")


class NoPublicConstructor(type):
    """A metaclass for classes that only the package builds.

    Calling the class raises ``TypeError``; the package builds instances
    with ``cls._create(...)``. A ``Dispatcher`` made by hand would bypass
    the close logic of ``open_dispatcher``; a ``Slot`` made by hand would
    belong to no dispatcher.
    """

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor"
        )

    def _create(cls: type[T], *args: Any, **kwargs: Any) -> T:  # noqa: ANN401 (the class's own __init__ arguments)
        return super().__call__(*args, **kwargs)  # type: ignore[misc, no-any-return]  # type.__call__ of the class itself


def wrong_with(usage: str) -> Callable[..., NoReturn]:
    """Context-manager methods for the wrong ``with``: each raises ``TypeError(usage)``.

    ``with`` on an async context manager, or ``async with`` on a plain one,
    would raise Python's generic "does not support the context manager
    protocol"; assigned to the other protocol's two methods (``with`` looks
    both up before it calls the first), these say which ``with`` to use.
    ``{name}`` in ``usage`` is the class's name. Assign them under ``if not
    TYPE_CHECKING``, so that type checkers still see the protocol missing.
    """

    def refuse(self: object, *_args: object) -> NoReturn:
        raise TypeError(usage.format(name=type(self).__name__))

    return refuse


@final
class AsyncWithOnly(Generic[T]):
    """An async context manager, for ``async with`` only, that says so otherwise.

    ``open_dispatcher()`` and the other ``open_`` functions return one
    around their own context manager: entering and leaving are its, and a
    plain ``with``, an ``await``, or an attribute of what it yields looked
    up on it (``open_dispatcher(...).slot``) raise ``TypeError`` or
    ``AttributeError`` with ``usage``, which says how to use it.
    """

    __slots__ = ("_manager", "_usage")

    def __init__(self, manager: AbstractAsyncContextManager[T], usage: str) -> None:
        self._manager = manager
        self._usage = usage

    def __repr__(self) -> str:
        return f"<{self._usage.partition(':')[0]}>"

    # Not coroutines of their own: the manager's, as they are.
    def __aenter__(self) -> Coroutine[Any, Any, T]:
        return self._manager.__aenter__()

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Coroutine[Any, Any, bool | None]:
        return self._manager.__aexit__(exc_type, exc, tb)

    if not TYPE_CHECKING:

        def __enter__(self, *_args: object) -> NoReturn:
            raise TypeError(self._usage)

        __exit__ = __await__ = __enter__

        def __getattr__(self, name: str) -> NoReturn:
            if name.startswith("_"):
                # A protocol's probe (copy, pickle, inspect): the usual answer.
                raise AttributeError(
                    f"{type(self).__name__!r} object has no attribute {name!r}",
                    name=name,
                    obj=self,
                )
            raise AttributeError(self._usage, name=name, obj=self)


def is_async_callable(value: object) -> bool:
    """Whether calling ``value`` gives a coroutine, as far as its type tells.

    ``inspect.iscoroutinefunction`` sees through bound methods and
    ``functools.partial``, but not an object whose ``__call__`` is
    ``async def``, nor a partial of one: those are unwrapped here.
    """
    while isinstance(value, functools.partial):
        value = value.func
    if inspect.iscoroutinefunction(value):
        return True
    if not callable(value) or inspect.isroutine(value) or inspect.isclass(value):
        return False  # a function, method or class: its own flags said no
    return inspect.iscoroutinefunction(type(value).__call__)


def warn_the_caller(warning: Warning) -> None:
    """Issue ``warning`` at the application's line that led to it.

    That is the first frame, going out, that is neither the package's nor
    ``contextlib``'s (an ``async with`` of a context manager the package
    made), however deep in the package the cause was found.
    """
    here = inspect.currentframe()
    frame = None if here is None else here.f_back
    level = 2  # stacklevel 2 is the caller's frame: 1 would be this function
    while (
        frame is not None
        and frame.f_back is not None
        and frame.f_globals.get("__name__", "").partition(".")[0] in _NOT_THE_CALLER
    ):
        frame = frame.f_back
        level += 1
    warnings.warn(warning, stacklevel=level)


_NOT_THE_CALLER: Final = frozenset({"trio_dispatch", "contextlib"})


def needs_extra(what: str, extra: str) -> str:
    """The one-line hint for ``what`` when the ``extra`` it needs is missing."""
    return f"{what} needs the {extra} extra: pip install 'trio-dispatch[{extra}]'"


def raise_if_extra_missing(
    exc: ModuleNotFoundError, what: str, extra: str, *packages: str
) -> None:
    """Raise the hint naming ``extra`` if ``exc`` is one of ``packages`` missing.

    Any other missing module (a bug, a broken install) is left to the caller
    to re-raise as it is.

    Raises:
        ModuleNotFoundError: ``exc`` says one of ``packages`` is not installed.
    """
    package = (exc.name or "").partition(".")[0]
    if package in packages:
        raise ModuleNotFoundError(needs_extra(what, extra), name=package) from exc


def fixup_module_metadata(module_name: str, namespace: Mapping[str, object]) -> None:
    """Show each public name of ``namespace`` where users import it from.

    Sets ``__module__`` of every function and class in ``__all__`` that is
    still marked as defined in a private module, so the first public module
    that exports a name (``trio_dispatch`` before ``trio_dispatch.providers``,
    say) is the one its repr, its docs and its pickles name.

    An attrs class's string annotations are resolved first, in the module
    that defines it: ``typing.get_type_hints`` (and so cattrs) looks names up
    in ``sys.modules[cls.__module__]``, which would then be the public
    module. One that names what only type checkers import is left as it is.
    """
    for name in namespace["__all__"]:  # type: ignore[attr-defined]  # every public module has __all__
        if name not in namespace:
            continue  # imported when first used (the module's __getattr__)
        value = namespace[name]
        module = getattr(value, "__module__", None)
        if (
            isinstance(module, str)
            and module.startswith("trio_dispatch.")
            and any(part.startswith("_") for part in module.split("."))
        ):
            if isinstance(value, type) and attrs.has(value):
                _resolve_types(value, vars(sys.modules[module]))
            value.__module__ = module_name


def _resolve_types(cls: type, namespace: dict[str, Any]) -> None:
    # NameError: it names a type only imported for type checkers; no
    # converter structures it, and its hints stay strings.
    with contextlib.suppress(NameError):
        attrs.resolve_types(cls, globalns=namespace)


def put_or_remove(mapping: dict[K, T], key: K, value: T | None) -> None:
    """Set ``key`` to ``value`` in ``mapping``, or remove it for ``None``."""
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value
