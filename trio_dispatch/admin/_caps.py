"""The admin API's caps on what a request may carry, documented in one place."""

from __future__ import annotations

from typing import Final

from .._validation import MAX_LIMIT as _MAX_LIMIT

MAX_LIMIT: Final = _MAX_LIMIT
"""The highest limit ``PUT /limits/{provider}`` sets; more is refused (422).

The same bound as everywhere else (``open_dispatcher``, ``set_limit``,
``AdaptiveLimit``). For no limit at all, ``DELETE /limits/{provider}``.
"""

MAX_PROVIDER_LENGTH: Final = 256
"""The longest provider name a route takes, in characters; longer is 422."""

MAX_BODY_BYTES: Final = 1024
"""The largest request body read, in bytes; a larger one is refused (413)."""

MIN_TOKEN_LENGTH: Final = 16
"""The shortest token ``admin_app`` accepts, in characters."""
