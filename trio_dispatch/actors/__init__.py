"""The actors: a scheduler per provider and one per conversation, under the dispatcher.

Internal: import the public names from ``trio_dispatch`` and the plumbing
from ``trio_dispatch.lowlevel``.
"""
