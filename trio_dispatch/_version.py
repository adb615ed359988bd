"""The package's version, in a module of its own that imports nothing.

The one place it is written: ``pyproject.toml`` reads it from here. Until
a release is published it is a development version (``.devN``) of the
next one, so that no two trees share a released version's name: the
release drops the ``.devN``, and the tree after it takes the next one's.
"""

from __future__ import annotations

__version__ = "0.1.0rc1.dev0"
