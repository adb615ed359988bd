"""The benchmarks, as functions the command line and ``bench/`` scripts run.

- ``run_handoff_benchmarks``: how fast and how lean a slot changes hands,
  next to ``trio.CapacityLimiter`` (``bench/handoff.py``).
- ``run_http_benchmark``: the latency the dispatcher adds to an LLM call
  over loopback HTTP (``bench/http_latency.py``).
- ``run_fairness_sweep``: turn latency per scheduling policy across loads
  and turn shapes, in virtual time (now in ``trio_dispatch.testing``).

All of them run from ``trio-dispatch bench``.
"""

from ..testing import FAIRNESS_QUANTILES as QUANTILES
from ..testing import FairnessConfig as FairnessConfig
from ..testing import FairnessReport as FairnessReport
from ..testing import FairnessRow as FairnessRow
from ..testing import run_fairness_sweep as run_fairness_sweep
from ._handoff import HandoffReport as HandoffReport
from ._handoff import HandoffSizes as HandoffSizes
from ._handoff import Measurement as Measurement
from ._handoff import Target as Target
from ._handoff import run_handoff_benchmarks as run_handoff_benchmarks
from ._http import HttpBenchReport as HttpBenchReport
from ._http import PathLatency as PathLatency
from ._http import run_http_benchmark as run_http_benchmark

__all__ = [
    "QUANTILES",
    "FairnessConfig",
    "FairnessReport",
    "FairnessRow",
    "HandoffReport",
    "HandoffSizes",
    "HttpBenchReport",
    "Measurement",
    "PathLatency",
    "Target",
    "run_fairness_sweep",
    "run_handoff_benchmarks",
    "run_http_benchmark",
]
