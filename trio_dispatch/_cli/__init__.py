"""The ``trio-dispatch`` command.

::

    trio-dispatch demo         a fleet of agents through the dispatcher, over HTTP
    trio-dispatch simulate     one virtual-time simulation, policies side by side
    trio-dispatch bench NAME   a benchmark: fairness (policies under load, swept)
    trio-dispatch serve-fake   the fake LLM server on its own

Bad options exit with status 2 and a one-line reason, before anything runs:
sizes have upper bounds (shown in ``--help``), and every output path is
checked (a folder that exists or can be made, writable, and not a folder
where a file goes) without creating anything. Files are written only when
a run has finished, each one whole (written beside its target, then renamed
into place), so a failed or interrupted run leaves nothing half-written; the
demo interrupted during its second (FIFO) run writes what its first run
measured, and says the comparison is incomplete.

Ctrl+C stops any command with status 130 and one line on stderr.

``demo`` needs the ``demo`` extra (rich, matplotlib, hypercorn), and so do
plots (``simulate --plot``, ``bench fairness``); ``serve-fake`` needs the
``testing`` extra (hypercorn). Without rich, the others print plain text. A
command missing a package it needs says, in one line and before it starts,
which extra to install (status 1).

Nothing in the library imports this package: it is the command line, the
demo and their plots, built on the public API.
"""

from __future__ import annotations

from ._main import main as main

__all__ = ["main"]
