"""Oldest-agent-first concurrency limits for LLM providers, as trio actors.

The public API of an application: ``open_dispatcher`` and what it gives
(``Dispatcher``, ``Slot``, ``Conversation``), the values they take and
return, and one exception tree. Beside it: ``trio_dispatch.messages`` (the
chat model and stream events), ``trio_dispatch.providers`` (LLM APIs over
HTTP), ``trio_dispatch.testing`` (a fake LLM server, a scripted provider,
the simulator) and ``trio_dispatch.lowlevel`` (the plumbing, less stable).

Those, and ``events``, ``metrics``, ``otel`` and ``admin``, load on first
use (PEP 562): after ``import trio_dispatch``, ``trio_dispatch.events.Granted``
works, and importing the package alone loads no HTTP library and no
optional extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._conversations._compaction import SUMMARY_PREFIX as SUMMARY_PREFIX
from ._conversations._conversation import Conversation as Conversation
from ._conversations._conversation import TurnStream as TurnStream
from ._conversations._history import dump_history as dump_history
from ._conversations._history import load_history as load_history
from ._conversations._options import ConversationOptions as ConversationOptions
from ._conversations._results import Retrying as Retrying
from ._conversations._results import ToolResult as ToolResult
from ._conversations._results import TurnEvent as TurnEvent
from ._conversations._results import TurnFinished as TurnFinished
from ._conversations._results import TurnResult as TurnResult
from ._conversations._tools import Tool as Tool
from ._conversations._turn_parts import ConversationStatistics as ConversationStatistics
from ._dispatch._backend import ProviderStatistics as ProviderStatistics
from ._dispatch._dispatcher import Dispatcher as Dispatcher
from ._dispatch._dispatcher import wrap_provider as wrap_provider
from ._dispatch._open import open_dispatcher as open_dispatcher
from ._dispatch._slot import Slot as Slot
from ._dispatch._statistics import DispatcherStatistics as DispatcherStatistics
from ._dispatch._turn import Turn as Turn
from ._dispatch._turn import current_turn as current_turn
from ._endpoint import Endpoint as Endpoint
from ._exceptions import BackendUnavailable as BackendUnavailable
from ._exceptions import ConversationClosed as ConversationClosed
from ._exceptions import DispatcherClosed as DispatcherClosed
from ._exceptions import DispatchError as DispatchError
from ._exceptions import LeaseLost as LeaseLost
from ._exceptions import PoolRemoved as PoolRemoved
from ._exceptions import PoolUnreachable as PoolUnreachable
from ._exceptions import ProviderError as ProviderError
from ._exceptions import QueueFull as QueueFull
from ._exceptions import ServerLoadUnavailable as ServerLoadUnavailable
from ._exceptions import SlotHoldTimeout as SlotHoldTimeout
from ._exceptions import TooManyToolRounds as TooManyToolRounds
from ._exceptions import UnknownProviderWarning as UnknownProviderWarning
from ._exceptions import UnknownServerMetrics as UnknownServerMetrics
from ._policy._budgets import BudgetStatistics as BudgetStatistics
from ._policy._ratelimits import Quota as Quota
from ._policy._ratelimits import RateLimitInfo as RateLimitInfo
from ._policy._slots import PoolStatistics as PoolStatistics
from ._policy._tenants import TenantStatistics as TenantStatistics
from ._pool_provider import PoolProvider as PoolProvider
from ._provider import Provider as Provider
from ._server_load._formats import parse_server_load as parse_server_load
from ._server_load._load import ServerLoad as ServerLoad
from ._server_load._probe import ServerMetrics as ServerMetrics
from ._util import fixup_module_metadata
from ._version import __version__ as __version__
from .messages._chat import RequestOptions as RequestOptions
from .messages._limits import AdaptiveLimit as AdaptiveLimit
from .messages._limits import Budget as Budget
from .messages._limits import Tenant as Tenant

if TYPE_CHECKING:
    from types import ModuleType

    from . import admin as admin
    from . import events as events
    from . import lowlevel as lowlevel
    from . import messages as messages
    from . import metrics as metrics
    from . import otel as otel
    from . import providers as providers
    from . import testing as testing

__all__ = [
    "SUMMARY_PREFIX",
    "AdaptiveLimit",
    "BackendUnavailable",
    "Budget",
    "BudgetStatistics",
    "Conversation",
    "ConversationClosed",
    "ConversationOptions",
    "ConversationStatistics",
    "DispatchError",
    "Dispatcher",
    "DispatcherClosed",
    "DispatcherStatistics",
    "Endpoint",
    "LeaseLost",
    "PoolProvider",
    "PoolRemoved",
    "PoolStatistics",
    "PoolUnreachable",
    "Provider",
    "ProviderError",
    "ProviderStatistics",
    "QueueFull",
    "Quota",
    "RateLimitInfo",
    "RequestOptions",
    "Retrying",
    "ServerLoad",
    "ServerLoadUnavailable",
    "ServerMetrics",
    "Slot",
    "SlotHoldTimeout",
    "Tenant",
    "TenantStatistics",
    "TooManyToolRounds",
    "Tool",
    "ToolResult",
    "Turn",
    "TurnEvent",
    "TurnFinished",
    "TurnResult",
    "TurnStream",
    "UnknownProviderWarning",
    "UnknownServerMetrics",
    "current_turn",
    "dump_history",
    "load_history",
    "open_dispatcher",
    "parse_server_load",
    "wrap_provider",
]

# Show the public names where users import them from, as httpx and trio do.
fixup_module_metadata(__name__, globals())
# Only names of the API stay public in the namespace.
del fixup_module_metadata, TYPE_CHECKING, annotations

# The public subpackages, imported on first attribute access. ``metrics``,
# ``otel``, ``admin`` and ``testing`` need extras; their import says which.
_SUBPACKAGES = frozenset(
    {
        "admin",
        "events",
        "lowlevel",
        "messages",
        "metrics",
        "otel",
        "providers",
        "testing",
    }
)


def __getattr__(name: str) -> ModuleType:
    """``trio_dispatch.events`` and the other subpackages, imported when first used."""
    if name in _SUBPACKAGES:
        # The import system sets the attribute too: later lookups never get here.
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names and the subpackages, loaded or not (for completion)."""
    return sorted({*__all__, *_SUBPACKAGES, "__version__"})
