"""The package's version, in a module of its own that imports nothing."""

from __future__ import annotations

__version__ = "0.1.0.dev0"
