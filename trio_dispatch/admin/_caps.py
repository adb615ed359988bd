"""The admin API's caps on what a request may carry, documented in one place."""

from __future__ import annotations

from typing import Final

MAX_LIMIT: Final = 100_000
"""The highest limit ``PUT /limits/{provider}`` sets; more is refused (422).

For more than that, lift the limit with ``DELETE /limits/{provider}``.
"""

MAX_PROVIDER_LENGTH: Final = 256
"""The longest provider name a route takes, in characters; longer is 422."""

MAX_BODY_BYTES: Final = 1024
"""The largest request body read, in bytes; a larger one is refused (413)."""

MIN_TOKEN_LENGTH: Final = 16
"""The shortest token ``admin_app`` accepts, in characters."""
