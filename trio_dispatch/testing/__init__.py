"""Tools for testing and measuring code built on trio-dispatch.

- ``open_fake_llm_server`` serves a scripted LLM API (OpenAI and Anthropic
  wire formats, latency, tool calls, faults) on loopback, for tests that
  want real sockets. It needs hypercorn, from the ``testing`` extra:
  ``pip install 'trio-dispatch[testing]'``.
"""

from ._fake_server import FakeLLMServer as FakeLLMServer
from ._fake_server import FakeRequest as FakeRequest
from ._fake_server import FakeServerStatistics as FakeServerStatistics
from ._fake_server import WireFormat as WireFormat
from ._fake_server import open_fake_llm_server as open_fake_llm_server
from ._script import FakeReply as FakeReply
from ._script import FakeScript as FakeScript
from ._script import FakeToolCall as FakeToolCall
from ._script import Fault as Fault
from ._script import FaultKind as FaultKind

__all__ = [
    "FakeLLMServer",
    "FakeReply",
    "FakeRequest",
    "FakeScript",
    "FakeServerStatistics",
    "FakeToolCall",
    "Fault",
    "FaultKind",
    "WireFormat",
    "open_fake_llm_server",
]
