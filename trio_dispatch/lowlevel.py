"""The plumbing under trio-dispatch, for tests, simulations and new backends.

Less stable than the rest of the package: names here may change between
minor versions. An application needs none of them; ``trio_dispatch``,
``trio_dispatch.messages``, ``trio_dispatch.providers`` and
``trio_dispatch.testing`` are its API.

- The scheduling core: ``SlotPolicy`` (the synchronous, I/O-free state
  machine that decides every grant), its ``PolicyStatistics`` (and
  ``MemberStatistics``, each member's of a pool, ``MemberState``,
  what a member learned, carried into another policy, and
  ``GroupState`` and ``WaitingState``, a whole pooled policy's, carried
  into another as groups merge), the
  ``Ticket`` that orders requests, and the ``Throttle`` it asks about
  budgets and adaptive limits.
- The scheduler actor, ``SchedulerActor``, and the protocol it speaks:
  ``Acquire``, ``Release``, ``Cancel``, ``SetLimit``, ``Adapt``, ``Pause``,
  ``Resume``, ``Answered``, ``Failed``, ``ReportUsage``, ``ObserveLatency``, ``ObserveServerLoad``, ``ObserveRateLimits``,
  ``SetTenant``, ``SetModelBudget``, and for a scheduler of pooled
  providers ``ForMember`` (a message for one member or pool of it),
  ``SetPool`` and ``RemovePool`` (together ``SchedulerMessage``),
  answered through a ``Reply`` (``granted(ticket, granted_at)`` or
  ``refused(error)``, and ``lease_until(deadline)`` from a backend that
  leases its slots; called by the backend only); ``Grant`` is a grant
  kept as a value, for whoever records them.
- The backend interface, ``Backend``: each provider's scheduler, as the
  dispatcher uses it: ``ticket``, ``send`` (every message above goes
  through it), ``statistics``, ``close``, and ``run``, which the
  dispatcher starts in its nursery; its docstring says what a backend
  promises (order, answers, never blocking, leases).
  ``open_dispatcher_with(new_backend, limits, **options)`` opens a
  dispatcher whose providers each get the backend ``new_backend(setup)``
  returns, given a ``BackendSetup``: what the dispatcher knows of the
  provider (limit, budgets, tenants, ``max_waiting``, pauses, the clock)
  and its ``Translator`` (``setup.events``), which turns each scheduling
  step into log lines and events. ``setup.policy()`` builds the
  ``SlotPolicy`` that honours every setting, and
  ``policy_statistics(provider, policy, now)`` reports it as a backend's
  ``statistics()`` must. The dispatcher's own backends
  are made the same way: ``SchedulerActor.from_setup`` in one process, the
  Redis-shared scheduler of ``redis_url`` for a fleet. A third backend
  needs only the names here and ``trio_dispatch.ProviderStatistics``.
- The dispatcher's machinery: ``plumbing(dispatcher)`` gives its
  ``Plumbing`` (backends, settings, event hub, nursery), what integrations
  build on: ``start_soon``, ``hold`` and ``hold_deadline``,
  ``check_known``, ``check_run``, ``default_max_tokens``, ``wall_ms``
  (an instant as Unix milliseconds on the dispatcher's wall clock, the
  Redis server's with ``redis_url``), ``watch_call``,
  ``observe_events`` (an ``EventSink`` is handed every event as it
  happens) and ``observe_calls`` (a ``CallObserver`` is told of every LLM
  call's end), beside what ``Dispatcher`` does. Their old names on
  ``Dispatcher`` are deprecated.
- Tool arguments checked against their JSON schema: ``check_arguments``.
"""

from ._conversations._tools import check_arguments as check_arguments
from ._dispatch._backend import Backend as Backend
from ._dispatch._dispatcher import plumbing as plumbing
from ._dispatch._open import open_dispatcher_with as open_dispatcher_with
from ._dispatch._plumbing import Plumbing as Plumbing
from ._dispatch._setup import BackendSetup as BackendSetup
from ._dispatch._setup import policy_statistics as policy_statistics
from ._observe._hub import CallObserver as CallObserver
from ._observe._hub import EventSink as EventSink
from ._observe._translator import Translator as Translator
from ._policy._budgets import Throttle as Throttle
from ._policy._slots import GroupState as GroupState
from ._policy._slots import MemberState as MemberState
from ._policy._slots import MemberStatistics as MemberStatistics
from ._policy._slots import PolicyStatistics as PolicyStatistics
from ._policy._slots import SlotPolicy as SlotPolicy
from ._policy._slots import WaitingState as WaitingState
from ._util import fixup_module_metadata
from .actors._scheduler import SchedulerActor as SchedulerActor
from .messages._protocol import Acquire as Acquire
from .messages._protocol import Adapt as Adapt
from .messages._protocol import Answered as Answered
from .messages._protocol import Cancel as Cancel
from .messages._protocol import Failed as Failed
from .messages._protocol import ForMember as ForMember
from .messages._protocol import Grant as Grant
from .messages._protocol import ObserveLatency as ObserveLatency
from .messages._protocol import ObserveRateLimits as ObserveRateLimits
from .messages._protocol import ObserveServerLoad as ObserveServerLoad
from .messages._protocol import Pause as Pause
from .messages._protocol import Release as Release
from .messages._protocol import RemovePool as RemovePool
from .messages._protocol import Reply as Reply
from .messages._protocol import ReportUsage as ReportUsage
from .messages._protocol import Resume as Resume
from .messages._protocol import SchedulerMessage as SchedulerMessage
from .messages._protocol import SetLimit as SetLimit
from .messages._protocol import SetModelBudget as SetModelBudget
from .messages._protocol import SetPool as SetPool
from .messages._protocol import SetTenant as SetTenant
from .messages._protocol import Ticket as Ticket

__all__ = [
    "Acquire",
    "Adapt",
    "Answered",
    "Backend",
    "BackendSetup",
    "CallObserver",
    "Cancel",
    "EventSink",
    "Failed",
    "ForMember",
    "Grant",
    "GroupState",
    "MemberState",
    "MemberStatistics",
    "ObserveLatency",
    "ObserveRateLimits",
    "ObserveServerLoad",
    "Pause",
    "Plumbing",
    "PolicyStatistics",
    "Release",
    "RemovePool",
    "Reply",
    "ReportUsage",
    "Resume",
    "SchedulerActor",
    "SchedulerMessage",
    "SetLimit",
    "SetModelBudget",
    "SetPool",
    "SetTenant",
    "SlotPolicy",
    "Throttle",
    "Ticket",
    "Translator",
    "WaitingState",
    "check_arguments",
    "open_dispatcher_with",
    "plumbing",
    "policy_statistics",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
