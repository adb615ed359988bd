"""The typed messages trio-dispatch's actors exchange."""

from ._scheduling import Acquire as Acquire
from ._scheduling import Cancel as Cancel
from ._scheduling import Grant as Grant
from ._scheduling import Pause as Pause
from ._scheduling import Release as Release
from ._scheduling import Reply as Reply
from ._scheduling import SchedulerMessage as SchedulerMessage
from ._scheduling import SetLimit as SetLimit
from ._scheduling import Ticket as Ticket

__all__ = [
    "Acquire",
    "Cancel",
    "Grant",
    "Pause",
    "Release",
    "Reply",
    "SchedulerMessage",
    "SetLimit",
    "Ticket",
]
