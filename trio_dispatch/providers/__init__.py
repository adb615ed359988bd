"""LLM providers over HTTP: two wire formats, the protocol, their errors.

``OpenAIProvider`` speaks OpenAI-compatible chat completions (OpenAI, vLLM,
DeepSeek, ...), ``AnthropicProvider`` Anthropic's Messages API. Both stream
``trio_dispatch.messages`` events through an async context manager and
raise the ``ProviderError`` tree drawn in ``trio_dispatch``'s exceptions
(re-exported here). ``Provider`` is the protocol any provider follows; the
dispatcher's side and this side share it and the errors, and nothing on the
dispatcher's side imports this package.
"""

from .._exceptions import AuthenticationError as AuthenticationError
from .._exceptions import BadRequest as BadRequest
from .._exceptions import MalformedStream as MalformedStream
from .._exceptions import Overloaded as Overloaded
from .._exceptions import ProviderConnectionError as ProviderConnectionError
from .._exceptions import ProviderError as ProviderError
from .._exceptions import RateLimited as RateLimited
from .._exceptions import RequestFailed as RequestFailed
from .._exceptions import ServerError as ServerError
from .._exceptions import StreamInterrupted as StreamInterrupted
from .._provider import Provider as Provider
from .._provider import RateLimitObserver as RateLimitObserver
from .._provider import RateLimitReporter as RateLimitReporter
from .._util import fixup_module_metadata
from .._wire._retry_after import parse_retry_after as parse_retry_after
from ._anthropic import AnthropicProvider as AnthropicProvider
from ._openai import OpenAIProvider as OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "AuthenticationError",
    "BadRequest",
    "MalformedStream",
    "OpenAIProvider",
    "Overloaded",
    "Provider",
    "ProviderConnectionError",
    "ProviderError",
    "RateLimitObserver",
    "RateLimitReporter",
    "RateLimited",
    "RequestFailed",
    "ServerError",
    "StreamInterrupted",
    "parse_retry_after",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
