"""LLM providers over HTTP: the protocol, two wire formats, their errors.

``OpenAIProvider`` speaks OpenAI-compatible chat completions (OpenAI, vLLM,
DeepSeek, ...), ``AnthropicProvider`` Anthropic's Messages API. Both stream
``trio_dispatch.messages`` events through an async context manager and
raise the ``ProviderError`` tree drawn in ``_errors``.
"""

from ._anthropic import AnthropicProvider as AnthropicProvider
from ._base import Provider as Provider
from ._base import RateLimitReporter as RateLimitReporter
from ._errors import AuthenticationError as AuthenticationError
from ._errors import BadRequest as BadRequest
from ._errors import MalformedStream as MalformedStream
from ._errors import Overloaded as Overloaded
from ._errors import ProviderConnectionError as ProviderConnectionError
from ._errors import ProviderError as ProviderError
from ._errors import RateLimited as RateLimited
from ._errors import RequestFailed as RequestFailed
from ._errors import ServerError as ServerError
from ._errors import StreamInterrupted as StreamInterrupted
from ._limited import LimitedProvider as LimitedProvider
from ._limited import wrap_provider as wrap_provider
from ._openai import OpenAIProvider as OpenAIProvider
from ._retry_after import parse_retry_after as parse_retry_after
from ._sse import EventStream as EventStream

__all__ = [
    "AnthropicProvider",
    "AuthenticationError",
    "BadRequest",
    "EventStream",
    "LimitedProvider",
    "MalformedStream",
    "OpenAIProvider",
    "Overloaded",
    "Provider",
    "ProviderConnectionError",
    "ProviderError",
    "RateLimitReporter",
    "RateLimited",
    "RequestFailed",
    "ServerError",
    "StreamInterrupted",
    "parse_retry_after",
    "wrap_provider",
]
