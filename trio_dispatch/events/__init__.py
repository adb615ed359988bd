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
  the ``model`` the answer was for).

Every event has ``at``, when it happened on the trio clock. Together they
are ``DispatchEvent``. ``EventSubscription`` is what ``dispatcher.events()``
returns: a bounded buffer that never slows the schedulers down and counts
what it had to drop.
"""

from .._util import fixup_module_metadata
from ..actors._observe import DispatchEvent as DispatchEvent
from ..actors._observe import EventSubscription as EventSubscription
from ..actors._observe import Granted as Granted
from ..actors._observe import LimitChanged as LimitChanged
from ..actors._observe import Paused as Paused
from ..actors._observe import Queued as Queued
from ..actors._observe import RateLimitsReceived as RateLimitsReceived
from ..actors._observe import Refused as Refused
from ..actors._observe import Released as Released
from ..actors._observe import Resumed as Resumed
from ..actors._observe import Withdrawn as Withdrawn

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
    "Withdrawn",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
