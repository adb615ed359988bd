"""The dispatcher: one backend per provider, behind ``open_dispatcher``.

The ``Backend`` interface, ``open_dispatcher``, the ``Dispatcher``, its
settings, its slots, turns, and its statistics.
"""
