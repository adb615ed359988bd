"""The wire formats: everything the package knows of an LLM API's HTTP shape.

One module per format, each ending with its ``Format`` value:
``_openai.py`` (chat completions) and ``_anthropic.py`` (Messages). Each
holds the format's endpoint and headers, its request body, the decoder
of its stream and the encoder the fake server uses, its error bodies and
its rate-limit headers, read and written. Beside them, what every format
shares: server-sent events (``_sse.py``), the decoder base and the shapes
that name a malformed event's wrong fields (``_decoder.py``), the
encoders' plan of a reply (``_encode.py``), the errors both APIs' words
map to (``_errors.py``), ``Retry-After`` (``_retry_after.py``) and the
reading of rate-limit headers (``_headers.py``).

The providers (the HTTP clients), the transport's metering and the testing
kit take a format from ``FORMATS`` and know nothing of it themselves; a
new format is a new module here, registered below. Nothing here loads an
HTTP library.
"""

from __future__ import annotations

from typing import Final

from ._anthropic import ANTHROPIC
from ._format import Format
from ._openai import OPENAI

#: Every wire format, by name.
FORMATS: Final[dict[str, Format]] = {wire.name: wire for wire in (OPENAI, ANTHROPIC)}

__all__ = ["ANTHROPIC", "FORMATS", "OPENAI", "Format"]
