"""The pure rules: every scheduling decision, synchronous and free of I/O.

``SlotPolicy`` (``_slots``) orders the waiting requests and decides every
grant; ``Throttle`` (``_budgets``) holds the request and token budgets, the
backoff and the adaptive limit it consults; ``Tenants`` (``_tenants``) shares
the slots among tenants by weight; ``RateLimitInfo`` (``_ratelimits``) is
what an answer says of the account's limits. Nothing here imports trio or
any library that does I/O: both backends feed these rules, and the Redis
scripts are held to them by a differential test.
"""
