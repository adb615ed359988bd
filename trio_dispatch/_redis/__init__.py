"""The Redis backend: one provider's limits, order and pauses shared by a fleet.

``_scheduler`` is its actor (one per provider, the ``Backend`` of
``redis_url``), ``_backend`` the connection and the rounds it serves,
``_book`` the process's side of the shared queue, ``_ledger`` the rounds'
arguments and answers, ``_scripts`` the Lua scripts of ``lua/`` as Redis
runs them, and ``_clock`` the offset to the server's clock. ``SCHEMA.md``
describes the keys.
"""
