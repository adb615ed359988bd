"""``parse_server_load``: the load a server's ``/metrics`` reports, for each server.

The fixtures are the exposition text of each server's endpoint, written
from the names, types, labels and HELP strings of the servers' own
sources, among the other metrics each one exports beside them:

- ``metrics_vllm.prom``: vLLM's ``PrometheusStatLogger``
  (``vllm/v1/metrics/loggers.py``) with two engine cores (data parallel),
  written by ``prometheus_client`` as vLLM's endpoint is, with the
  process and GC collectors, counters (``_total`` and ``_created``) and
  histograms; 7 + 5 running, 3 + 0 waiting;
- ``metrics_llamacpp.prom``: llama.cpp's ``server_task_result_metrics::
  to_metrics`` (``tools/server/server-task.cpp``): its counters then its
  gauges, unlabelled, numbers as C++ streams print them; 4 processing, 11
  deferred;
- ``metrics_sglang.prom``: SGLang's ``SchedulerMetricsCollector`` and
  ``TokenizerMetricsCollector``
  (``python/sglang/srt/observability/metrics_collector.py``) in
  ``prometheus_client``'s multiprocess mode, labelled by model, engine
  type and ranks; 6 running, 2 queued;
- ``metrics_tgi.prom``: TGI's router (``router/src/server.rs``) through
  ``metrics-exporter-prometheus``: counters without ``_total``, gauges,
  histograms with its geometric duration buckets; a batch of 3, 9 queued.
"""

from __future__ import annotations

import pathlib
import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import (
    ServerLoad,
    ServerLoadUnavailable,
    UnknownServerMetrics,
    parse_server_load,
)
from trio_dispatch._server_load._formats import GAUGES, metrics_text

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures"

LOOKED_FOR = re.escape(
    "vllm:num_requests_running and vllm:num_requests_waiting (vLLM), "
    "llamacpp:requests_processing and llamacpp:requests_deferred (llama.cpp's server), "
    "sglang:num_running_reqs and sglang:num_queue_reqs (SGLang), "
    "tgi_batch_current_size and tgi_queue_size (TGI)"
)


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("metrics_vllm.prom", ServerLoad(running=12, waiting=3, format="vllm")),
        (
            "metrics_llamacpp.prom",
            ServerLoad(running=4, waiting=11, format="llama.cpp"),
        ),
        ("metrics_sglang.prom", ServerLoad(running=6, waiting=2, format="sglang")),
        ("metrics_tgi.prom", ServerLoad(running=3, waiting=9, format="tgi")),
    ],
)
def test_each_server_s_endpoint_gives_its_exact_load(
    fixture: str, expected: ServerLoad
) -> None:
    load = parse_server_load((FIXTURES / fixture).read_text(encoding="utf-8"))
    assert load == expected
    # Gauges written as floats (vLLM's "7.0") become the ints they count.
    assert type(load.running) is int
    assert type(load.waiting) is int


def test_every_label_set_of_a_gauge_is_summed() -> None:
    # Three engine cores of a data-parallel vLLM, and a series of an
    # engine that another label tells apart: every series counts.
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 8.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 8.0\n'
        'vllm:num_requests_running{engine="2",model_name="m"} 5.0\n'
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0\n'
        'vllm:num_requests_waiting{engine="2",model_name="m"} 1.0\n'
    )
    assert parse_server_load(text) == ServerLoad(running=21, waiting=5, format="vllm")


def test_series_of_one_gauge_written_apart_are_summed_too() -> None:
    # Series of one name split by another metric come back as two families.
    text = (
        'sglang:num_running_reqs{dp_rank="0"} 2\n'
        'sglang:num_queue_reqs{dp_rank="0"} 1\n'
        'sglang:num_running_reqs{dp_rank="1"} 3\n'
    )
    assert parse_server_load(text) == ServerLoad(running=5, waiting=1, format="sglang")


def test_sglang_s_per_priority_breakdown_is_not_counted_twice() -> None:
    # With priority scheduling, SGLang writes the total under priority=""
    # and each priority's share beside it, in the same gauge.
    labels = 'engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"'
    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        f'sglang:num_running_reqs{{{labels},priority=""}} 7.0\n'
        f'sglang:num_running_reqs{{{labels},priority="0"}} 4.0\n'
        f'sglang:num_running_reqs{{{labels},priority="10"}} 3.0\n'
        "# TYPE sglang:num_queue_reqs gauge\n"
        f'sglang:num_queue_reqs{{{labels},priority=""}} 5.0\n'
        f'sglang:num_queue_reqs{{{labels},priority="0"}} 0.0\n'
        f'sglang:num_queue_reqs{{{labels},priority="10"}} 5.0\n'
    )
    assert parse_server_load(text) == ServerLoad(running=7, waiting=5, format="sglang")


def test_a_gauge_not_yet_exported_beside_its_pair_counts_zero() -> None:
    # TGI registers each gauge when it first sets it: a request queued
    # before the first batch shows the queue and no batch yet.
    text = "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\ntgi_queue_size 1\n"
    assert parse_server_load(text) == ServerLoad(running=0, waiting=1, format="tgi")


def test_gauges_written_without_a_type_line_are_read() -> None:
    text = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 0\n"
    assert parse_server_load(text) == ServerLoad(
        running=2, waiting=0, format="llama.cpp"
    )


def test_a_gauge_with_no_series_counts_zero() -> None:
    # A labelled gauge before its first series: declared, nothing counted.
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0"} 2\n'
    )
    assert parse_server_load(text) == ServerLoad(running=0, waiting=2, format="vllm")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "",
            rf"^the text names none of the gauges looked for: {LOOKED_FOR}$",
            id="empty",
        ),
        pytest.param(
            "# HELP python_info Python platform information\n"
            "# TYPE python_info gauge\n"
            'python_info{implementation="CPython",major="3"} 1.0\n'
            "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 3.0\n',
            rf"^the text names none of the gauges looked for: {LOOKED_FOR}$",
            id="other-metrics-only",
        ),
        pytest.param(
            "<html><body>Not Found</body></html>",
            r"^the text is not in Prometheus' text exposition format \(.+\)$",
            id="html",
        ),
        pytest.param(
            '{"running": 3, "waiting": 1}',
            r"^the text is not in Prometheus' text exposition format \(.+\)$",
            id="json",
        ),
        pytest.param(
            "tgi_queue_size three\n",
            r"^the text is not in Prometheus' text exposition format \(.+\)$",
            id="a-value-that-is-no-number",
        ),
        pytest.param(
            "vllm:num_requests_running 1\nsglang:num_queue_reqs 2\n",
            r"^the text names the gauges of more than one server: vLLM and SGLang$",
            id="two-servers",
        ),
        pytest.param(
            'vllm:num_requests_running{engine="0",model_name="m"} -1\nvllm:num_requests_waiting 0\n',
            r'^vllm:num_requests_running\{engine="0",model_name="m"\} must be a non-negative whole number, got -1$',
            id="negative",
        ),
        pytest.param(
            "llamacpp:requests_processing 1\nllamacpp:requests_deferred NaN\n",
            r"^llamacpp:requests_deferred must be a non-negative whole number, got nan$",
            id="nan",
        ),
        pytest.param(
            "tgi_batch_current_size +Inf\ntgi_queue_size 0\n",
            r"^tgi_batch_current_size must be a non-negative whole number, got inf$",
            id="infinite",
        ),
        pytest.param(
            "sglang:num_running_reqs 2.5\nsglang:num_queue_reqs 0\n",
            r"^sglang:num_running_reqs must be a non-negative whole number, got 2\.5$",
            id="fraction",
        ),
        pytest.param(
            "# TYPE tgi_queue_size counter\ntgi_queue_size 4\ntgi_batch_current_size 1\n",
            r"^tgi_queue_size must be a gauge, got a counter$",
            id="a-counter",
        ),
        pytest.param(
            "# TYPE vllm:num_requests_running histogram\n"
            'vllm:num_requests_running_bucket{le="+Inf"} 1\n'
            "vllm:num_requests_running_count 1\n"
            "vllm:num_requests_running_sum 1\n",
            r"^vllm:num_requests_running must be a gauge, got a histogram$",
            id="a-histogram",
        ),
    ],
)
def test_what_is_no_server_s_load_raises_the_typed_error(
    text: str, message: str
) -> None:
    with pytest.raises(UnknownServerMetrics, match=message) as caught:
        parse_server_load(text)
    # A parser's ValueError, and a reading that failed, to be ignored.
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, ServerLoadUnavailable)
    assert caught.value.url is None
    assert caught.value.status_code is None


def test_the_parser_s_reason_is_kept_short() -> None:
    with pytest.raises(UnknownServerMetrics) as caught:
        parse_server_load("<html>" + "x" * 500 + "</html>\n")
    message = str(caught.value)
    assert message.endswith("...)")
    assert len(message) < 150


def test_text_must_be_a_string() -> None:
    with pytest.raises(
        TypeError, match=r"^text must be a string, got b'tgi_queue_size 1'$"
    ):
        parse_server_load(b"tgi_queue_size 1")  # type: ignore[arg-type]  # the bytes are the test


def test_without_prometheus_client_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes its import fail as a missing module would.
    monkeypatch.setitem(sys.modules, "prometheus_client.parser", None)
    with pytest.raises(
        ModuleNotFoundError,
        match=r"^parse_server_load needs the metrics extra: pip install 'trio-dispatch\[metrics\]'$",
    ):
        parse_server_load("tgi_queue_size 1\n")


def test_the_four_servers_and_their_gauges() -> None:
    # Held here as the servers' sources write them (see the module's docstring).
    assert [(g.format, g.running, g.waiting) for g in GAUGES] == [
        ("vllm", "vllm:num_requests_running", "vllm:num_requests_waiting"),
        ("llama.cpp", "llamacpp:requests_processing", "llamacpp:requests_deferred"),
        ("sglang", "sglang:num_running_reqs", "sglang:num_queue_reqs"),
        ("tgi", "tgi_batch_current_size", "tgi_queue_size"),
    ]


@given(
    running=st.integers(min_value=0, max_value=10**6),
    waiting=st.integers(min_value=0, max_value=10**6),
    server=st.sampled_from([gauges.format for gauges in GAUGES]),
)
def test_metrics_text_is_read_back_as_the_same_load(
    running: int, waiting: int, server: str
) -> None:
    load = ServerLoad(running=running, waiting=waiting, format=server)  # type: ignore[arg-type]  # one of the formats
    assert parse_server_load(metrics_text(load)) == load


def test_metrics_text_writes_the_server_s_own_help_and_type() -> None:
    load = ServerLoad(running=4, waiting=11, format="llama.cpp")
    assert metrics_text(load) == (
        "# HELP llamacpp:requests_processing Number of requests processing\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        "llamacpp:requests_processing 4\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        "llamacpp:requests_deferred 11\n"
    )


def test_metrics_text_needs_a_server_to_write_as() -> None:
    with pytest.raises(
        ValueError, match=r"^load\.format must name a server to write its metrics as$"
    ):
        metrics_text(ServerLoad(running=1, waiting=0))
