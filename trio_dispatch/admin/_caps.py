"""The admin API's caps on what a request may carry, documented in one place.

The bounds of a field are those of the value it becomes (``MAX_LIMIT`` is
``set_limit``'s, the weights ``Tenant``'s): the app's checks and the
OpenAPI document's schemas both read them here, so the document states
every bound the app enforces.
"""

from __future__ import annotations

from typing import Final

from .._validation import MAX_LIMIT as _MAX_LIMIT
from ..messages._limits import MAX_WEIGHT as _MAX_WEIGHT
from ..messages._limits import MIN_WEIGHT as _MIN_WEIGHT

MAX_LIMIT: Final = _MAX_LIMIT
"""The highest limit ``PUT /limits/{provider}`` sets; more is refused (422).

The same bound as everywhere else (``open_dispatcher``, ``set_limit``,
``AdaptiveLimit``). For no limit at all, ``DELETE /limits/{provider}``.
"""

MIN_WEIGHT: Final = _MIN_WEIGHT
"""The smallest weight ``PUT /tenants/{tenant}`` sets (``Tenant``'s); less is 422."""

MAX_WEIGHT: Final = _MAX_WEIGHT
"""The largest weight ``PUT /tenants/{tenant}`` sets (``Tenant``'s); more is 422."""

MAX_PROVIDER_LENGTH: Final = 256
"""The longest provider name a route takes, in characters; longer is 422."""

MAX_BODY_BYTES: Final = 1024
"""The largest request body read, in bytes; a larger one is refused (413)."""

MIN_TOKEN_LENGTH: Final = 16
"""The shortest token ``admin_app`` accepts, in characters."""
