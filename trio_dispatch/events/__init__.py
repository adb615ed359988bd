"""What happens to slots and providers: the values ``dispatcher.events()`` yields.

``async with dispatcher.events() as events: async for event in events``
yields one frozen value per thing that happens, in the order it happened:

- to a slot: ``Queued``, ``Granted`` (with its ``wait``), ``Released``
  (with its ``held`` time), ``Withdrawn`` (cancelled while waiting) and
  ``Refused`` (``QueueFull``). Each carries the provider, the
  ``conversation_id``, the turn's ``started_at``, the ``tenant`` and the
  ``model`` of the request (``None`` when it named none), and the slots in
  use and the requests waiting just after it;
- to a provider: ``Paused`` (with ``until`` and ``why``), ``Resumed``,
  ``LimitChanged`` and ``RateLimitsReceived`` (a ``RateLimitInfo``, and
  the ``model`` the answer was for); to a pool's member, ``ServiceChanged``
  (out of service after failures in a row, half-open, back in service).

Every event has ``at``, when it happened on the trio clock. Together they
are ``DispatchEvent``. ``EventSubscription`` is what ``dispatcher.events()``
returns: a bounded buffer that never slows the schedulers down and counts
what it had to drop.
"""

from .._observe._hub import DispatchEvent as DispatchEvent
from .._observe._hub import EventSubscription as EventSubscription
from .._observe._hub import Granted as Granted
from .._observe._hub import LimitChanged as LimitChanged
from .._observe._hub import Paused as Paused
from .._observe._hub import Queued as Queued
from .._observe._hub import RateLimitsReceived as RateLimitsReceived
from .._observe._hub import Refused as Refused
from .._observe._hub import Released as Released
from .._observe._hub import Resumed as Resumed
from .._observe._hub import ServiceChanged as ServiceChanged
from .._observe._hub import Withdrawn as Withdrawn
from .._util import fixup_module_metadata

__all__ = [
    "DispatchEvent",
    "EventSubscription",
    "Granted",
    "LimitChanged",
    "Paused",
    "Queued",
    "RateLimitsReceived",
    "Refused",
    "Released",
    "Resumed",
    "ServiceChanged",
    "Withdrawn",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
