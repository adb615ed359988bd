"""The load gauges of the servers that queue, read from their Prometheus metrics.

Each server exports, on its ``/metrics`` endpoint, in Prometheus' text
exposition format, a gauge of the requests it runs and a gauge of the
requests it queues. The names, as each server's own source writes them:

=========  ================================  ===============================
server     running                           waiting
=========  ================================  ===============================
vLLM       ``vllm:num_requests_running``     ``vllm:num_requests_waiting``
llama.cpp  ``llamacpp:requests_processing``  ``llamacpp:requests_deferred``
SGLang     ``sglang:num_running_reqs``       ``sglang:num_queue_reqs``
TGI        ``tgi_batch_current_size``        ``tgi_queue_size``
=========  ================================  ===============================

Where each server writes them: vLLM in ``vllm/v1/metrics/loggers.py``
(``PrometheusStatLogger``), llama.cpp in ``tools/server/server-task.cpp``
(``server_task_result_metrics::to_metrics``), SGLang in
``python/sglang/srt/observability/metrics_collector.py``
(``SchedulerMetricsCollector``), TGI in ``router/src/server.rs`` (their
descriptions) and ``backends/v3/src/backend.rs`` and ``queue.rs`` (their
values).

All eight are gauges. How each server shows them, and what the parser
makes of it:

- vLLM labels its gauges by ``model_name`` and ``engine`` (one series per
  engine core of a data-parallel server): the series are summed.
- llama.cpp's ``llama-server`` (started with ``--metrics``) writes them
  without labels, among its other ``llamacpp:`` counters and gauges.
- SGLang (``--enable-metrics``) labels them by ``model_name``,
  ``engine_type`` and the ranks (``tp_rank``, ``pp_rank``, ``dp_rank``...):
  the series are summed. With priority scheduling, the total is the
  series whose ``priority`` label is empty, beside a series per priority
  (``priority="1"``...) that breaks it down: only the total is counted.
- TGI (its router's ``metrics-exporter-prometheus``) writes them without
  labels, and only once it has first set them: until its first request it
  exports neither (its text names none of the gauges), and for a moment
  it may export one and not yet the other, which then counts 0.

The names carry a colon (vLLM's, llama.cpp's, SGLang's), which the format
allows. Their HELP strings are kept here too, so that ``metrics_text``
writes what the servers write (the fake server reports its load with it).

The text is parsed by ``prometheus_client``'s own parser (the ``metrics``
extra), imported when first needed, so the package loads it only for
those who read a server's load.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final, final

import attrs

from .._exceptions import UnknownServerMetrics
from .._util import raise_if_extra_missing
from .._validation import check_string
from ._load import ServerFormat, ServerLoad

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from prometheus_client.metrics_core import Metric
    from prometheus_client.samples import Sample


@final
@attrs.frozen
class Gauges:
    """One server's two gauges of its load, as its ``/metrics`` names them.

    Attributes:
        format: The server, as ``ServerLoad.format`` names it.
        server: The server, as the messages name it.
        running: The gauge of the requests it runs.
        waiting: The gauge of the requests it queues.
        running_help: The HELP text the server gives ``running``.
        waiting_help: The HELP text the server gives ``waiting``.
        labels: The labels the server writes on both, with ``{model}``
            for its served model's name (empty: none).
        floats: Whether it writes a whole count as a float (``3.0``, as
            ``prometheus_client`` does) rather than bare (``3``).
    """

    format: ServerFormat
    server: str
    running: str
    waiting: str
    running_help: str
    waiting_help: str
    labels: str = ""
    floats: bool = False


GAUGES: Final[tuple[Gauges, ...]] = (
    Gauges(
        "vllm",
        "vLLM",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "Number of requests in model execution batches.",
        "Number of requests waiting to be processed.",
        labels='model_name="{model}",engine="0"',
        floats=True,
    ),
    Gauges(
        "llama.cpp",
        "llama.cpp's server",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "Number of requests processing",
        "Number of requests deferred",
    ),
    Gauges(
        "sglang",
        "SGLang",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "The number of running requests.",
        "The number of requests in the waiting queue.",
        labels='model_name="{model}"',
        floats=True,
    ),
    Gauges(
        "tgi",
        "TGI",
        "tgi_batch_current_size",
        "tgi_queue_size",
        "Current batch size",
        "Current queue size",
    ),
)
"""Every server whose load is read, in the order the messages list them."""

_LOOKED_FOR: Final = ", ".join(
    f"{gauges.running} and {gauges.waiting} ({gauges.server})" for gauges in GAUGES
)

# A gauge written without a TYPE line is "unknown" to the parser: accepted,
# since its name is the server's. A counter or histogram by that name is not
# the server's gauge.
_GAUGE_TYPES: Final = frozenset({"gauge", "unknown"})

# SGLang's label of a per-priority breakdown; its total has it empty.
_PRIORITY: Final = "priority"


def parse_server_load(text: str) -> ServerLoad:
    """The running and waiting requests a model server's metrics report.

    ``text`` is the answer of a server's ``/metrics`` endpoint, in
    Prometheus' text exposition format. The server is recognised by the
    names of its gauges: vLLM's ``vllm:num_requests_running`` and
    ``vllm:num_requests_waiting``, llama.cpp's server's
    ``llamacpp:requests_processing`` and ``llamacpp:requests_deferred``,
    SGLang's ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``,
    TGI's ``tgi_batch_current_size`` and ``tgi_queue_size``. Every other
    metric of the text is ignored. The series of a gauge (vLLM's engines,
    SGLang's ranks) are summed; a gauge the text lacks while it has the
    other of the pair counts 0 (TGI exports each once it is first set).

    Needs the ``metrics`` extra (``prometheus_client``, whose parser reads
    the text).

    Args:
        text: The exposition text.

    Returns:
        The load, with ``format`` naming the server recognised.

    Raises:
        UnknownServerMetrics: The text is not in the exposition format,
            names none of the gauges above (the message lists them), names
            those of more than one server, or has in one of them what is
            no count of requests (negative, NaN, a fraction, or a metric
            of another type than a gauge).
        TypeError: ``text`` is not a string.
        ModuleNotFoundError: ``prometheus_client`` is not installed.
    """
    check_string(text, "text")
    families = _families(text)
    named = [
        gauges
        for gauges in GAUGES
        if {gauges.running, gauges.waiting} & families.keys()
    ]
    if not named:
        raise UnknownServerMetrics(
            f"the text names none of the gauges looked for: {_LOOKED_FOR}"
        )
    if len(named) > 1:
        servers = " and ".join(gauges.server for gauges in named)
        raise UnknownServerMetrics(
            f"the text names the gauges of more than one server: {servers}"
        )
    (gauges,) = named
    return ServerLoad(
        running=_count(gauges.running, families.get(gauges.running, ())),
        waiting=_count(gauges.waiting, families.get(gauges.waiting, ())),
        format=gauges.format,
    )


def metrics_text(load: ServerLoad, model_name: str = "model") -> str:
    """``load`` as its server's ``/metrics`` shows it: its two gauges.

    The reverse of ``parse_server_load``, for a fake server to report its
    load in the format of the server it stands for (``load.format``), with
    that server's labels (``model_name``: its served model's name) and way
    of writing numbers.

    Raises:
        ValueError: ``load.format`` is ``None``: no server to write as.
    """
    if load.format is None:
        raise ValueError("load.format must name a server to write its metrics as")
    (gauges,) = (gauges for gauges in GAUGES if gauges.format == load.format)
    labels = gauges.labels.format(model=_escaped(model_name))
    shown = f"{{{labels}}}" if labels else ""
    lines = []
    for name, help_text, value in (
        (gauges.running, gauges.running_help, load.running),
        (gauges.waiting, gauges.waiting_help, load.waiting),
    ):
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} gauge",
            f"{name}{shown} {float(value) if gauges.floats else value}",
        ]
    return "\n".join(lines) + "\n"


def _escaped(value: str) -> str:
    """A label value as the exposition format escapes it."""
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def _families(text: str) -> Mapping[str, Sequence[Metric]]:
    """The text's metric families, by name (a name may come back in pieces)."""
    try:
        from prometheus_client.parser import (  # noqa: PLC0415 (the metrics extra, loaded when used)
            text_string_to_metric_families,
        )
    except ModuleNotFoundError as exc:
        raise_if_extra_missing(exc, "parse_server_load", "metrics", "prometheus_client")
        raise  # pragma: no cover (another module missing: a broken install)
    families: dict[str, list[Metric]] = {}
    try:
        for family in text_string_to_metric_families(text):
            families.setdefault(family.name, []).append(family)
    except ValueError as exc:
        # The parser's reason quotes the line it stopped at: kept short.
        reason = str(exc)
        reason = reason if len(reason) <= 80 else f"{reason[:77]}..."
        raise UnknownServerMetrics(
            f"the text is not in Prometheus' text exposition format ({reason})"
        ) from None
    return families


def _count(name: str, families: Sequence[Metric]) -> int:
    """The sum of a load gauge's series: requests, a non-negative whole number each."""
    total = 0
    for family in families:
        if family.type not in _GAUGE_TYPES:
            raise UnknownServerMetrics(f"{name} must be a gauge, got a {family.type}")
        for sample in family.samples:
            if sample.labels.get(_PRIORITY, ""):
                continue  # one priority's share of the total counted beside it
            value = sample.value
            if not (math.isfinite(value) and value >= 0 and float(value).is_integer()):
                raise UnknownServerMetrics(
                    f"{_shown(sample)} must be a non-negative whole number,"
                    f" got {value!r}"
                )
            total += int(value)
    return total


def _shown(sample: Sample) -> str:
    """A sample's name and labels, as the exposition text writes them."""
    if not sample.labels:
        return sample.name
    labels = ",".join(
        f'{key}="{value}"' for key, value in sorted(sample.labels.items())
    )
    return f"{sample.name}{{{labels}}}"
