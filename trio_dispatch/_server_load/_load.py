"""What a self-hosted model server says of its own load: ``ServerLoad``.

A plain value, checked on its fields, with no I/O: the parser of the
servers' metrics (``_formats``) and the readers (``_probe``) make it, and
whatever acts on it later imports it without loading either.
"""

from __future__ import annotations

from typing import Final, Literal, final

import attrs

from .._validation import non_negative_int, one_of

ServerFormat = Literal["vllm", "llama.cpp", "sglang", "tgi"]
"""The servers whose metrics are recognised, by the name ``ServerLoad.format`` gives."""

SERVER_FORMATS: Final[tuple[ServerFormat, ...]] = ("vllm", "llama.cpp", "sglang", "tgi")


@final
@attrs.frozen(kw_only=True)
class ServerLoad:
    """A model server's own count of the requests it runs and the requests it queues.

    Self-hosted servers (vLLM, llama.cpp's ``llama-server``, SGLang, TGI)
    take every request they are sent and queue what their batch cannot
    hold, first come first served. ``waiting`` is that queue: requests the
    server holds without working on them yet.

    Attributes:
        running: Requests the server is working on now (in its batch).
        waiting: Requests it has accepted and queued behind them.
        format: The server whose metrics it was read from (``"vllm"``,
            ``"llama.cpp"``, ``"sglang"`` or ``"tgi"``), or ``None`` for a
            load that came from elsewhere (a callable of your own).
    """

    running: int = attrs.field(validator=non_negative_int)
    waiting: int = attrs.field(validator=non_negative_int)
    format: ServerFormat | None = attrs.field(
        default=None, validator=attrs.validators.optional(one_of(*SERVER_FORMATS))
    )
