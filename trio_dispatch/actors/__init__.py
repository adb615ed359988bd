"""The local backend: the scheduler actor of one provider and its mailbox.

Internal: import the public names from ``trio_dispatch`` and the plumbing
from ``trio_dispatch.lowlevel``.
"""
