"""The actors: one scheduler per provider and one per conversation, supervised
by the dispatcher.

Internal: import the public names from ``trio_dispatch`` and the plumbing
from ``trio_dispatch.lowlevel``.
"""
