"""The admin API: see and steer a running dispatcher over HTTP.

``admin_app(dispatcher, token=...)`` is a plain ASGI 3 application (no web
framework, so the package needs nothing to offer it) that reads the limits,
changes them, shows and sets the tenants' shares, shows the statistics,
lifts a pause and serves the Prometheus metrics and its own OpenAPI
document. Serve it with hypercorn on trio, in
the nursery that holds the dispatcher (``hypercorn.trio.serve``, from the
``admin`` extra: ``pip install 'trio-dispatch[admin]'``).
"""

from .._util import fixup_module_metadata
from ._app import AdminApp as AdminApp
from ._app import admin_app as admin_app
from ._caps import MAX_BODY_BYTES as MAX_BODY_BYTES
from ._caps import MAX_LIMIT as MAX_LIMIT
from ._caps import MAX_PROVIDER_LENGTH as MAX_PROVIDER_LENGTH
from ._caps import MAX_WEIGHT as MAX_WEIGHT
from ._caps import MIN_TOKEN_LENGTH as MIN_TOKEN_LENGTH
from ._caps import MIN_WEIGHT as MIN_WEIGHT

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_LIMIT",
    "MAX_PROVIDER_LENGTH",
    "MAX_WEIGHT",
    "MIN_TOKEN_LENGTH",
    "MIN_WEIGHT",
    "AdminApp",
    "admin_app",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
