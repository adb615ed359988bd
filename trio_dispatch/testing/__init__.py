"""Tools for testing and measuring code built on trio-dispatch.

- ``open_fake_llm_server`` serves a scripted LLM API (OpenAI and Anthropic
  wire formats) on loopback, with per-key ``FakeQuotas``, or queueing over
  batch slots as a self-hosted server does (``FakeBatching``, with its
  ``/metrics``); it needs hypercorn: ``pip install 'trio-dispatch[testing]'``.
- ``ScriptedProvider`` plays the same ``FakeScript`` in memory, as a
  ``Provider``, exact under ``autojump_clock``.
- ``StreamingASGITransport`` serves an ASGI app (a ``FakeLLMServer``) to
  an ``httpx2.AsyncClient`` in the same trio run, streaming, with no
  socket: the server's pacing is exact under ``autojump_clock`` too.
- ``run_simulation`` / ``simulate`` play a seeded ``Workload`` of agent
  turns (drawn from distributions, or a trace's: ``Workload.from_trace``)
  in virtual time through the real dispatcher, under a policy or a
  ``DispatcherConfig`` of your own; ``run_comparison`` / ``compare`` put
  them side by side with FIFO and oldest-first.
- ``run_fairness_sweep`` and ``run_priority_classes`` compare policies and
  priority agings over several loads (plots need the ``demo`` extra).
- ``trio_dispatch.testing.strategies`` has hypothesis strategies (also in
  the ``testing`` extra).
"""

import typing as _typing

from .._util import fixup_module_metadata
from ._batching import FakeBatching as FakeBatching
from ._compare import Comparison as Comparison
from ._compare import compare as compare
from ._compare import run_comparison as run_comparison
from ._distributions import CallsPerTurn as CallsPerTurn
from ._distributions import Duration as Duration
from ._fairness import FAIRNESS_QUANTILES as FAIRNESS_QUANTILES
from ._fairness import FairnessConfig as FairnessConfig
from ._fairness import FairnessReport as FairnessReport
from ._fairness import FairnessRow as FairnessRow
from ._fairness import PriorityClassesConfig as PriorityClassesConfig
from ._fairness import PriorityClassesReport as PriorityClassesReport
from ._fairness import PriorityClassRow as PriorityClassRow
from ._fairness import run_fairness_sweep as run_fairness_sweep
from ._fairness import run_priority_classes as run_priority_classes
from ._fake_server import FakeLLMServer as FakeLLMServer
from ._fake_server import open_fake_llm_server as open_fake_llm_server
from ._metrics import PolicyMetrics as PolicyMetrics
from ._metrics import ProviderRecord as ProviderRecord
from ._metrics import TurnRecord as TurnRecord
from ._metrics import compute_metrics as compute_metrics
from ._metrics import jain_index as jain_index
from ._metrics import percentile as percentile
from ._quotas import FakeQuotas as FakeQuotas
from ._script import FakeReply as FakeReply
from ._script import FakeRequest as FakeRequest
from ._script import FakeScript as FakeScript
from ._script import FakeToolCall as FakeToolCall
from ._script import Fault as Fault
from ._script import FaultKind as FaultKind
from ._script import WireFormat as WireFormat
from ._scripted import ScriptedProvider as ScriptedProvider
from ._simulation import POLICIES as POLICIES
from ._simulation import DispatcherConfig as DispatcherConfig
from ._simulation import PolicyName as PolicyName
from ._simulation import SimCall as SimCall
from ._simulation import SimulationResult as SimulationResult
from ._simulation import run_simulation as run_simulation
from ._simulation import simulate as simulate
from ._tally import FakeServerStatistics as FakeServerStatistics
from ._workloads import BURST_SPACING as BURST_SPACING
from ._workloads import BurstArrivals as BurstArrivals
from ._workloads import PoissonArrivals as PoissonArrivals
from ._workloads import RateCurve as RateCurve
from ._workloads import Scenario as Scenario
from ._workloads import SimProvider as SimProvider
from ._workloads import Trace as Trace
from ._workloads import TurnSpec as TurnSpec
from ._workloads import Workload as Workload

__all__ = [
    "BURST_SPACING",
    "FAIRNESS_QUANTILES",
    "POLICIES",
    "BurstArrivals",
    "CallsPerTurn",
    "Comparison",
    "DispatcherConfig",
    "Duration",
    "FairnessConfig",
    "FairnessReport",
    "FairnessRow",
    "FakeBatching",
    "FakeLLMServer",
    "FakeQuotas",
    "FakeReply",
    "FakeRequest",
    "FakeScript",
    "FakeServerStatistics",
    "FakeToolCall",
    "Fault",
    "FaultKind",
    "PoissonArrivals",
    "PolicyMetrics",
    "PolicyName",
    "PriorityClassRow",
    "PriorityClassesConfig",
    "PriorityClassesReport",
    "ProviderRecord",
    "RateCurve",
    "Scenario",
    "ScriptedProvider",
    "SimCall",
    "SimProvider",
    "SimulationResult",
    "StreamingASGITransport",
    "Trace",
    "TurnRecord",
    "TurnSpec",
    "WireFormat",
    "Workload",
    "compare",
    "compute_metrics",
    "jain_index",
    "open_fake_llm_server",
    "percentile",
    "run_comparison",
    "run_fairness_sweep",
    "run_priority_classes",
    "run_simulation",
    "simulate",
]

if _typing.TYPE_CHECKING:
    from ._asgi import StreamingASGITransport as StreamingASGITransport


def __getattr__(name: str) -> object:
    """``StreamingASGITransport``, imported when first used: it needs httpx2."""
    if name == "StreamingASGITransport":
        from ._asgi import StreamingASGITransport  # noqa: PLC0415  # httpx2 only when used

        StreamingASGITransport.__module__ = __name__
        globals()[name] = StreamingASGITransport
        return StreamingASGITransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


fixup_module_metadata(__name__, globals())
del fixup_module_metadata
