"""One pool member for ``bench/pool_llmock.py``: llmock's server, and the keys it was sent.

Usage (started by that benchmark, one process per member)::

    python bench/_llmock_member.py PORT KEYS_FILE

Serves llmock's own ASGI app (``llmock.main.create_app``, its settings from
its ``LLMOCK_*`` environment) with uvicorn on ``127.0.0.1:PORT``. Before
llmock sees a request, the key it carries (its ``Authorization`` or
``x-api-key`` header, as llmock itself reads keys) is appended to
``KEYS_FILE``, one line per model call, with nothing else changed: what the
instance was sent, written by the instance.
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from llmock.main import create_app

Scope = dict[str, Any]


def recording(app: Any, path: str) -> Any:  # noqa: ANN401 (an ASGI app)
    """``app``, with each model call's key appended to the file at ``path`` first."""

    async def middleware(scope: Scope, receive: Any, send: Any) -> None:  # noqa: ANN401
        if scope["type"] == "http" and scope["path"].endswith(
            ("/chat/completions", "/messages")
        ):
            headers = dict(scope["headers"])
            key = headers.get(b"authorization") or headers.get(b"x-api-key") or b""
            with open(path, "a", encoding="ascii") as keys:  # noqa: ASYNC230  # one short line
                keys.write(key.decode("ascii") + "\n")
        await app(scope, receive, send)

    return middleware


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    uvicorn.run(
        recording(create_app(), path), host="127.0.0.1", port=port, log_level="warning"
    )


if __name__ == "__main__":
    main()
